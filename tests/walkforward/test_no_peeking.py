"""A fold's test window is never seen in training or model selection: shuffling its bars (or
changing every bar after the validation window) leaves training, every validation score and the
chosen network bit-identical; only the test score moves. Changing one validation bar does move
the selection record, so the comparison can fail."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gper.dqn.config import from_settings
from gper.envs.market_data import Bars
from gper.walkforward.fold import run_fold

TINY = dict(
    env="market",
    device="cpu",
    backend="torch",
    hidden=(16,),
    num_envs=8,
    batch_size=32,
    buffer_size=4096,
    learning_starts=256,
    total_steps=1600,
    validations=4,
    episode_len=64,
    progress=False,
    tensorboard=False,
    flat_fallback=False,  # the chosen network is scored even where it loses on validation
)


def with_closes(bars: Bars, close: torch.Tensor) -> Bars:
    return Bars(bars.time_ns, close)


def run(bars, fold, **kw):
    return run_fold(from_settings(TINY | kw), bars, fold, torch.device("cpu"))


def shuffled_test_bars(bars: Bars, fold, seed: int, later: float) -> Bars:
    """``bars`` with the fold's test bars in a random order (``seed``) and every bar after them times ``later``."""
    close = bars.close.clone()
    g = torch.Generator().manual_seed(seed)
    window = close[fold.test.start : fold.test.end]
    close[fold.test.start : fold.test.end] = window[torch.randperm(len(window), generator=g)]
    close[fold.test.end :] *= later
    return with_closes(bars, close)


def same_selection(a, b) -> bool:
    return (
        a.validations == b.validations
        and a.chosen == b.chosen
        and a.state.keys() == b.state.keys()
        and all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    )


def test_shuffled_test_bars_change_the_test_score_only(fold_setup):
    bars, fold = fold_setup
    base = run(bars, fold)
    assert base.validations and not base.chosen["flat"]
    close = bars.close.clone()
    g = torch.Generator().manual_seed(0)
    window = close[fold.test.start : fold.test.end]
    close[fold.test.start : fold.test.end] = window[torch.randperm(len(window), generator=g)]
    # and every later return: the future after the fold
    later = torch.rand(len(close) - fold.test.end, generator=g, dtype=torch.float64)
    close[fold.test.end :] *= torch.exp(0.05 * (later - 0.5)).cumprod(0)
    shuffled = run(with_closes(bars, close), fold)
    assert same_selection(base, shuffled)
    assert base.test["policy_pnl"].shape == shuffled.test["policy_pnl"].shape
    assert (base.test["hold_pnl"] != shuffled.test["hold_pnl"]).any()  # the test walk read the new bars
    for name, (pnl, traded) in base.test["baselines"].items():  # the classical baselines as well
        assert pnl.shape == traded.shape == base.test["policy_pnl"].shape
        assert (pnl != shuffled.test["baselines"][name][0]).any(), name


def test_the_baselines_read_no_bar_after_their_decisions(fold_setup):
    """A baseline's position at a test bar reads the bars up to it: changing every bar from some
    test bar on leaves its trades before that bar, and its P&L before the bar before it, as they were."""
    bars, fold = fold_setup
    base = run(bars, fold)
    cut = fold.test.start + 20
    close = bars.close.clone()
    close[cut:] *= torch.linspace(1.05, 0.8, len(close) - cut, dtype=close.dtype)
    changed = run(with_closes(bars, close), fold)
    k = cut - fold.test.start  # test bar index of bar `cut`: its return is the first the change moves
    for name, (pnl, traded) in base.test["baselines"].items():
        again_pnl, again_traded = changed.test["baselines"][name]
        assert (traded[: k + 1] == again_traded[: k + 1]).all(), name  # decided at bars before `cut`
        assert (pnl[:k] == again_pnl[:k]).all(), name
        assert (pnl[k:] != again_pnl[k:]).any(), name


def test_a_changed_validation_bar_changes_the_selection_record(fold_setup):
    bars, fold = fold_setup
    base = run(bars, fold)
    close = bars.close.clone()
    close[fold.val.start + 10 :] *= 1.03  # one bar's return in the validation window moves by +3%
    moved = run(with_closes(bars, close), fold)
    assert not same_selection(base, moved)
    # training read none of it: the first validation differs in its score, not in its step
    assert [v["env_step"] for v in base.validations] == [v["env_step"] for v in moved.validations]


def test_a_fold_is_deterministic_and_seeded_per_fold(fold_setup):
    bars, fold = fold_setup
    a, b = run(bars, fold), run(bars, fold)
    assert same_selection(a, b)
    other = run(bars, dataclasses.replace(fold, index=fold.index + 1))
    assert other.cfg.seed != a.cfg.seed


def test_training_never_reads_the_validation_bars(fold_setup):
    """One validation, at the end of training: the network it scores is the trained one, and it is
    bit-identical with every validation and later bar changed (only the score moves)."""
    bars, fold = fold_setup
    base = run(bars, fold, validations=1)
    close = bars.close.clone()
    g = torch.Generator().manual_seed(1)
    noise = torch.rand(len(close) - fold.val.start, generator=g, dtype=torch.float64)
    close[fold.val.start :] *= torch.exp(0.05 * (noise - 0.5)).cumprod(0)
    moved = run(with_closes(bars, close), fold, validations=1)
    assert len(base.validations) == len(moved.validations) == 1
    assert all(torch.equal(base.state[k], moved.state[k]) for k in base.state)
    assert base.validations[0]["score"] != moved.validations[0]["score"]


def test_the_selection_is_deflated_and_a_rule_can_keep_the_fold_flat(fold_setup):
    """Every fold reports its chosen checkpoint's deflated Sharpe ratio over its validations; with
    min_deflated_sharpe above it, the fold stays flat on its test bars (the same checkpoint chosen)."""
    bars, fold = fold_setup
    base = run(bars, fold)
    c = base.chosen
    assert c["trials"] == len(base.validations) and 0.0 <= c["deflated_sharpe"] <= 1.0 and not c["flat"]
    strict = run(bars, fold, min_deflated_sharpe=min(0.999999, c["deflated_sharpe"] + 1e-6))
    assert strict.chosen["flat"] and strict.chosen["epoch"] == c["epoch"]
    from gper.walkforward.run import _fold_line

    said = _fold_line(fold, 3, strict, None)
    assert f"flat (its deflated Sharpe ratio is below {strict.cfg.walk.min_deflated_sharpe})" in said
    assert f"deflated Sharpe {c['deflated_sharpe']:.2f} of {c['trials']} candidates" in _fold_line(fold, 3, base, None)
    assert not strict.test["policy_pnl"].any() and not strict.test["policy_traded"].any()
    with pytest.raises(ValueError, match="min_deflated_sharpe must be a probability"):
        run(bars, fold, min_deflated_sharpe=1.5)


def test_a_fold_of_three_actions_trades_and_stays_flat_with_them(fold_setup):
    """actions=3 in a fold: the network has three outputs and trades; a fold kept flat walks the
    middle action (no trade, no P&L)."""
    bars, fold = fold_setup
    three = run(bars, fold, actions=3)
    weights = [v for k, v in three.state.items() if k.endswith("weight")]
    assert weights[-1].shape[0] == 3 and three.test["policy_traded"].any()
    least = min(0.999999, three.chosen["deflated_sharpe"] + 1e-6)
    flat = run(bars, fold, actions=3, min_deflated_sharpe=least)
    assert flat.chosen["flat"] and not flat.test["policy_traded"].any() and not flat.test["policy_pnl"].any()


def test_with_volatility_targeting_the_test_bars_are_still_unseen(fold_setup):
    """vol_target: each bar's scale reads the returns up to it, so shuffling the test bars (and
    changing every later one) leaves training and selection bit-identical; the policy's test walk
    holds scaled positions (its turnover is not in whole position units any more)."""
    bars, fold = fold_setup
    base = run(bars, fold, vol_target=0.15)
    shuffled = run(shuffled_test_bars(bars, fold, 1, 1.1), fold, vol_target=0.15)
    assert same_selection(base, shuffled)
    plain = run(bars, fold)
    assert not torch.equal(torch.as_tensor(base.test["policy_pnl"]), torch.as_tensor(plain.test["policy_pnl"]))
    # the baselines at the run's target: 15% here, as without one
    for name, (pnl, _) in base.test["baselines"].items():
        assert (pnl == plain.test["baselines"][name][0]).all(), name
    ten = run(bars, fold, vol_target=0.10)
    for name, (pnl, _) in ten.test["baselines"].items():
        np.testing.assert_allclose(pnl, plain.test["baselines"][name][0] * 10 / 15, rtol=1e-12, atol=1e-15)


def test_a_turnover_penalty_trains_the_fold_and_leaves_its_scores_in_pnl(fold_setup):
    """turnover_bps shapes the training reward: the fold trains another policy (that its walks count
    the log P&L without the penalty is the environment's test)."""
    bars, fold = fold_setup
    taxed = run(bars, fold, turnover_bps=20.0)
    plain = run(bars, fold)
    assert taxed.validations != plain.validations  # trained on another reward

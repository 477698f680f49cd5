"""Ensembles in walk-forward folds: the members' walks, the mean position's P&L, a fold of a
population, its report and its run (resume included)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_no_peeking import TINY, same_selection, shuffled_test_bars
from test_walk_command import SMALL

from gper._volatility import volatility_scale
from gper.cli import main
from gper.dqn.config import from_settings
from gper.envs.market import WARMUP, MarketEnv, synthetic_prices, trade
from gper.walkforward.ensemble import ensemble_pnl, trade_ensemble, walk_members
from gper.walkforward.fold import run_fold, score
from gper.walkforward.outcome import FoldOutcome
from gper.walkforward.report import build_report, report_markdown

CPU = torch.device("cpu")


def _walker(prices: torch.Tensor, copies: int, vol: bool, n_actions: int = 45) -> MarketEnv:
    scale = volatility_scale(prices.numpy(), 0.15) if vol else None
    return MarketEnv(
        prices, copies, CPU, episode_len=len(prices) - 1 - WARMUP, random_start=False, cost_bps=3.0,
        n_actions=n_actions, vol_scale=scale,
    )  # fmt: skip


def _policy(seed: int, n_actions: int):
    """A policy that reads its observations (a hash of them) so each copy's actions follow its own state."""

    def policy(obs: torch.Tensor) -> torch.Tensor:
        key = (obs.sum(dim=1) * 1000 + seed).abs().floor().to(torch.int64)
        return key % n_actions

    return policy


@pytest.mark.parametrize("vol", [False, True])
def test_an_ensemble_of_one_is_its_member_bit_for_bit(vol):
    prices = synthetic_prices(400, seed=3)
    alone = trade(_policy(1, 45), _walker(prices, 1, vol))
    pnl, traded, walk = trade_ensemble(_policy(1, 45), _walker(prices, 1, vol))
    assert torch.equal(pnl, alone[0]) and torch.equal(traded, alone[1])
    assert torch.equal(walk.pnl[0], alone[0]) and torch.equal(walk.traded[0], alone[1])


@pytest.mark.parametrize("vol", [False, True])
def test_each_member_walks_as_it_would_alone(vol):
    """Copy i stepped by the actions of row i: the same as a walk of one copy with that policy
    (its own position and reward among its features)."""
    prices = synthetic_prices(300, seed=5)
    policies = [_policy(s, 5) for s in (1, 2, 3)]

    def rows(obs: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(obs[i : i + 1]) for i, p in enumerate(policies)])

    walk = walk_members(rows, _walker(prices, 3, vol, n_actions=5))
    for i, p in enumerate(policies):
        pnl, traded = trade(p, _walker(prices, 1, vol, n_actions=5))
        assert torch.equal(walk.pnl[i], pnl) and torch.equal(walk.traded[i], traded)
    assert not torch.equal(walk.pnl[0], walk.pnl[1])  # the policies differ: the comparison can fail


def test_the_ensemble_holds_the_mean_position():
    """A plain-Python oracle of the mean position's P&L and trades."""
    g = np.random.default_rng(0)
    held = g.uniform(-1.5, 1.5, (4, 30))
    returns = g.normal(0, 0.01, 30)
    cost = 2e-4
    pnl, traded = ensemble_pnl(torch.tensor(held), torch.tensor(returns), cost)
    prev = 0.0
    for t in range(30):
        mean = sum(held[s][t] for s in range(4)) / 4
        assert traded[t].item() == pytest.approx(abs(mean - prev), abs=1e-15)
        assert pnl[t].item() == pytest.approx(mean * returns[t] - cost * abs(mean - prev), abs=1e-15)
        prev = mean
    # opposite members cancel: no position, no trade
    flat = ensemble_pnl(torch.tensor(np.stack([held[0], -held[0]])), torch.tensor(returns), cost)
    assert not flat[0].any() and not flat[1].any()
    with pytest.raises(ValueError, match=r"held must be \[S, T\]"):
        ensemble_pnl(torch.tensor(held[0]), torch.tensor(returns), cost)


def _run(bars, fold, **kw):
    return run_fold(from_settings(TINY | kw), bars, fold, CPU)


def test_a_fold_of_a_population_trades_the_mean_of_its_members(fold_setup, monkeypatch):
    """population 3: member 0 is the single run (the same seed, the same checkpoint: one validation,
    at the end); the policy's P&L is the mean position's; validation scores the ensemble."""
    import gper.walkforward.fold as fold_module

    bars, fold = fold_setup
    single = _run(bars, fold, validations=1)
    walks = []

    def kept(policy, env, band=0.0):
        out = trade_ensemble(policy, env, band)
        walks.append((out, env.returns[WARMUP + 1 :].clone(), env.cost))
        return out

    monkeypatch.setattr(fold_module, "trade_ensemble", kept)
    ens = _run(bars, fold, validations=1, population=3)
    # the validation walk, then the test walk: the test's policy P&L and trades are the mean
    # position's, from the members' units held
    (val, _, _), ((pnl_t, traded_t, walk), returns, cost) = walks
    assert walk.held.shape == (3, len(ens.test["policy_pnl"]))
    mean_pnl, mean_traded = ensemble_pnl(walk.held, returns, cost)
    np.testing.assert_array_equal(ens.test["policy_pnl"], mean_pnl.numpy())
    np.testing.assert_array_equal(ens.test["policy_traded"], mean_traded.numpy())
    assert not np.allclose(ens.test["policy_pnl"], walk.pnl.mean(dim=0).numpy())  # not the members' mean P&L
    assert ens.validations[0]["score"] == pytest.approx(float(val[0].mean() / val[0].std(correction=0)))
    assert ens.chosen["members"] == 3 and "members" not in single.chosen
    pnl, traded = ens.test["members"]
    assert pnl.shape == traded.shape == (3, len(ens.test["policy_pnl"]))
    np.testing.assert_array_equal(pnl[0], single.test["policy_pnl"])
    np.testing.assert_array_equal(traded[0], single.test["policy_traded"])
    assert not np.array_equal(pnl[0], pnl[1])  # seeds differ
    (entry,) = ens.validations
    assert len(entry["member_scores"]) == 3 and entry["score"] not in entry["member_scores"]
    assert entry["member_scores"] == pytest.approx([score(p, "sharpe") for p in val[2].pnl], rel=1e-12, abs=1e-15)
    # averaging positions trades less than the members do on average
    assert ens.test["policy_traded"].sum() <= traded.sum(axis=1).mean()
    # the stacked state holds every member
    assert all(v.shape[0] == 3 for v in ens.state.values())


def test_an_ensemble_never_reads_its_test_bars(fold_setup):
    """The no-peeking test for ensembles: shuffled test bars (and changed later ones) leave the
    population's training, every validation and the chosen weights bit-identical."""
    bars, fold = fold_setup
    base = _run(bars, fold, population=2)
    shuffled = _run(shuffled_test_bars(bars, fold, 0, 1.07), fold, population=2)
    assert same_selection(base, shuffled)
    assert (base.test["hold_pnl"] != shuffled.test["hold_pnl"]).any()


def test_a_flat_ensemble_holds_nothing(fold_setup):
    bars, fold = fold_setup
    base = _run(bars, fold, population=2)
    least = min(0.999999, base.chosen["deflated_sharpe"] + 1e-6)
    flat = _run(bars, fold, population=2, min_deflated_sharpe=least)
    assert flat.chosen["flat"] and not flat.test["policy_pnl"].any() and not flat.test["policy_traded"].any()
    assert not flat.test["members"][0].any()


def _stopped_in_fold(k: int, monkeypatch, argv: list[str]) -> int:
    """``gper train argv`` with Ctrl-C inside fold ``k`` (counted from 0): its exit code."""
    import gper.walkforward.run as run_module

    real, calls = run_module.run_fold, []

    def stop(*args, **kwargs):
        calls.append(1)
        if len(calls) == k + 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "run_fold", stop)
    try:
        return main(argv)
    finally:
        monkeypatch.setattr(run_module, "run_fold", real)


def test_a_walk_forward_run_of_ensembles_reports_every_member_and_resumes(tmp_path, monkeypatch, capsys):

    torch.set_num_threads(1)
    flags = [*SMALL, "--population", "2", "--run-dir", str(tmp_path)]
    assert main(["train", *flags, "--run-name", "whole"]) == 0
    out = capsys.readouterr().out
    assert out.count("ensemble of 2 members") == 4 and "members alone" in out
    report = json.loads((tmp_path / "whole" / "report.json").read_text())
    oos = report["out_of_sample"]
    assert len(oos["members"]) == 2 and all(len(f["members"]) == 2 for f in report["folds"])
    assert oos["members_beating_flat"] == sum(m["log_pnl"] > 0 for m in oos["members"])
    assert [m["log_pnl"] for m in oos["members"]] == pytest.approx(
        [sum(f["members"][i]["log_pnl"] for f in report["folds"]) for i in range(2)]
    )
    md = (tmp_path / "whole" / "report.md").read_text()
    assert "## Ensemble members (2)" in md and "| 1 |" in md
    # stopped inside fold 2, resumed: the finished folds' members are read back
    assert _stopped_in_fold(2, monkeypatch, ["train", *flags, "--run-name", "cut"]) == 130
    assert main(["train", "--resume", str(tmp_path / "cut"), "--progress", "False"]) == 0
    cut = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert cut["folds"] == report["folds"] and cut["out_of_sample"] == report["out_of_sample"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--population", "2", "--sweep", "learning_rate=1e-3,1e-4"], "--sweep is for plain runs"),
        (["--population", "2", "--n-step", "3"], "flat replay"),
    ],
)
def test_what_an_ensemble_cannot_train_is_refused_in_one_line(flags, message, tmp_path, capsys):
    assert main(["train", *SMALL, *flags, "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def _outcome(members):
    t = np.arange(3, dtype=np.int64) * 86_400 * 10**9 + 1_700_000_000 * 10**9
    w = {"start": "a", "end": "b", "bars": 3}
    from gper.walkforward.outcome import Window

    win = Window.from_dict(w)
    z = np.zeros(3)
    return FoldOutcome(0, win, win, win, {"flat": False}, t, z + 0.01, z + 0.5, z, z, members=members)


def test_fold_outcomes_keep_their_members_and_refuse_bad_ones():
    members = (np.full((2, 3), 0.01), np.full((2, 3), 0.5))
    fold = _outcome(members)
    back = FoldOutcome.from_dict(json.loads(json.dumps(fold.to_dict())))
    np.testing.assert_array_equal(back.members[0], members[0])
    assert [m["log_pnl"] for m in back.member_scores(None)] == pytest.approx([0.03, 0.03])
    report = build_report([back], {"series": "x"})
    assert len(report["out_of_sample"]["members"]) == 2 and "Ensemble members (2)" in report_markdown(report, "t")
    assert "members" not in build_report([_outcome(None)], {})["out_of_sample"]
    with pytest.raises(ValueError, match=r"members must be two \[S, 3\] arrays"):
        _outcome((np.zeros((2, 4)), np.zeros((2, 4))))
    with pytest.raises(ValueError, match="traded must be >= 0"):
        _outcome((np.zeros((2, 3)), -np.ones((2, 3))))
    with pytest.raises(ValueError, match="must be finite"):
        _outcome((np.full((2, 3), np.nan), np.zeros((2, 3))))


def test_a_no_trade_band_skips_the_small_trades():
    """Oracle: the position moves to the mean only where it is more than the band away; band 0 is
    the plain mean's walk."""
    from gper.walkforward.ensemble import banded

    target = np.array([0.05, 0.3, 0.35, 0.1, -0.5, -0.45, 0.0])
    assert banded(target, 0.2).tolist() == [0.0, 0.3, 0.3, 0.3, -0.5, -0.5, 0.0]
    assert banded(target, 0.0).tolist() == target.tolist()
    g = np.random.default_rng(1)
    held, returns = torch.tensor(g.uniform(-1, 1, (3, 40))), torch.tensor(g.normal(0, 0.01, 40))
    plain = ensemble_pnl(held, returns, 1e-4)
    assert all(torch.equal(a, b) for a, b in zip(plain, ensemble_pnl(held, returns, 1e-4, band=0.0), strict=True))
    pnl, traded = ensemble_pnl(held, returns, 1e-4, band=0.25)
    assert traded.sum() < plain[1].sum() and (traded[traded > 0] > 0.25).all()
    with pytest.raises(ValueError, match="band must be a finite number >= 0"):
        ensemble_pnl(held, returns, 1e-4, band=-0.1)


def test_a_fold_with_a_trade_band_trades_less_and_trains_the_same(fold_setup):
    bars, fold = fold_setup
    plain = _run(bars, fold, population=2, validations=1)
    band = _run(bars, fold, population=2, validations=1, trade_band=0.3)
    assert all(torch.equal(plain.state[k], band.state[k]) for k in plain.state)  # training is the same
    assert band.test["policy_traded"].sum() < plain.test["policy_traded"].sum()
    np.testing.assert_array_equal(band.test["members"][0], plain.test["members"][0])  # members trade alone
    with pytest.raises(ValueError, match="trade_band must be a finite number >= 0"):
        _run(bars, fold, trade_band=-1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("vol_target", [None, 0.15])
def test_a_fold_of_a_population_trains_and_trades_on_cuda(fold_setup, vol_target):
    """On CUDA the population is batched (one environment of every member's copies, batched matmuls,
    CUDA graphs): the fold trains, validates and tests the ensemble, and averaging positions never
    trades more than the members do on average (|mean(a) - mean(b)| <= mean |a - b|)."""
    bars, fold = fold_setup
    cuda = torch.device("cuda")
    settings = TINY | dict(device="cuda", backend="auto", population=3, validations=2, vol_target=vol_target)
    run = run_fold(from_settings(settings), bars, fold, cuda)
    assert run.chosen["members"] == 3 and len(run.validations) == 2
    assert all(len(v["member_scores"]) == 3 for v in run.validations)
    pnl, traded = run.test["members"]
    assert pnl.shape == (3, len(run.test["policy_pnl"])) and np.isfinite(pnl).all()
    assert run.test["policy_traded"].sum() <= traded.sum(axis=1).mean() + 1e-9
    assert all(v.shape[0] == 3 and v.device.type == "cpu" for v in run.state.values())


def test_a_resume_is_refused_where_its_folds_ran_otherwise(tmp_path, monkeypatch, capsys):
    """A resume checks what the run resolved: a cost that a changed default would move, and folds of
    one agent (a gper that ignored --population in walk-forward) under a population."""
    torch.set_num_threads(1)
    argv = ["train", *SMALL, "--population", "2", "--run-dir", str(tmp_path), "--run-name", "cut"]
    assert _stopped_in_fold(1, monkeypatch, argv) == 130
    folder = tmp_path / "cut"
    config = folder / "config.json"
    meta = json.loads(config.read_text())
    assert meta["config"]["cost_bps"] is None and meta["settings"]["cost_bps"] == 1.0  # synthetic prices
    meta["settings"]["cost_bps"] = 3.0
    config.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["train", "--resume", str(folder), "--progress", "False"]) == 2
    assert "its folds ran at cost_bps 3.0" in capsys.readouterr().err
    meta["settings"]["cost_bps"] = 1.0
    config.write_text(json.dumps(meta))
    fold0 = folder / "folds" / "fold_000.json"
    record = json.loads(fold0.read_text())
    del record["chosen"]["members"]
    fold0.write_text(json.dumps(record))
    assert main(["train", "--resume", str(folder), "--progress", "False"]) == 2
    assert "fold 0 trained one agent" in capsys.readouterr().err

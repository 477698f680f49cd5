"""The trading environment: features, rewards, episodes, data sources and evaluation."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pytest
import torch

from gper import _volatility as vol
from gper.envs.market import (
    MIN_BARS,
    N_ACTIONS,
    OBS_DIM,
    POSITIONS,
    WARMUP,
    MarketEnv,
    action_positions,
    evaluate,
    load_bars_csv,
    market_features,
    return_std,
    synthetic_prices,
)


def tiny_prices(n: int = MIN_BARS + 3, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n))))


def test_shapes_and_dtypes():
    env = MarketEnv(synthetic_prices(2000, 0), 8, "cpu", seed=0)
    obs = env.reset()
    assert (env.obs_dim, env.n_actions, OBS_DIM, N_ACTIONS) == (51, 45, 51, 45)
    torch.testing.assert_close(POSITIONS, torch.linspace(-1, 1, 45, dtype=torch.float64), rtol=0, atol=1e-15)
    assert POSITIONS[22] == 0 and POSITIONS[0] == -1 and POSITIONS[44] == 1
    assert obs.shape == (8, 51) and obs.dtype == torch.float32
    step = env.step(torch.randint(0, 45, (8,)))
    assert step.next_obs.shape == step.obs.shape == (8, 51)
    assert step.next_obs.dtype == step.obs.dtype == step.reward.dtype == torch.float32
    assert step.terminated.dtype == step.truncated.dtype == torch.bool
    assert not step.terminated.any()


def test_rewards_and_position_features_match_a_plain_python_computation():
    prices = tiny_prices()
    sigma, cost_bps = 0.02, 3.0
    env = MarketEnv(prices, 1, "cpu", episode_len=100, cost_bps=cost_bps, random_start=False, sigma=sigma)
    obs = env.reset()
    assert obs[0, 48:].tolist() == [0.0, 0.0, 0.0]
    p = prices.tolist()
    position, actions = 0.0, [44, 11, 0, 22]  # +1, -0.5, -1, 0
    for i, a in enumerate(actions):
        t = WARMUP + i
        target = -1.0 + 2.0 * a / 44
        log_pnl = target * math.log(p[t + 1] / p[t]) - cost_bps * 1e-4 * abs(target - position)
        step = env.step(torch.tensor([a]))
        assert env.last_log_pnl.item() == pytest.approx(log_pnl, rel=1e-12, abs=1e-15)
        assert step.reward.item() == pytest.approx(log_pnl / sigma, rel=1e-6)
        assert step.next_obs[0, 48].item() == pytest.approx(target)
        assert step.next_obs[0, 49].item() == step.reward.item()
        assert step.next_obs[0, 50].item() == pytest.approx((i + 1) / 100)
        position = target
    assert step.truncated.item()  # the data ends: len(prices) - 1 - WARMUP = 4 steps


def numpy_features(prices: np.ndarray, t: int, sigma: float) -> np.ndarray:
    """The 48 market features of bar ``t``, computed directly from their definitions."""
    r = np.diff(np.log(prices))  # r[k] is the return into bar k + 1
    recent = r[t - 40 : t]
    vols = [math.sqrt(np.mean(recent[-w:] ** 2)) for w in (5, 10, 20, 40)]
    moms = [math.log(prices[t] / prices[t - w]) / math.sqrt(w) for w in (5, 10, 20, 40)]
    return np.clip(np.concatenate([recent, vols, moms]) / sigma, -5, 5)


def test_features_match_a_numpy_reference():
    prices = synthetic_prices(600, 3, "ou")
    prices[300] *= 1.2  # a jump the returns features must clip
    sigma = return_std(prices)
    feats = market_features(prices, sigma)
    assert feats.shape == (600, 48) and feats.dtype == torch.float32
    assert feats[:WARMUP].eq(0).all()
    p = prices.numpy()
    for t in [WARMUP, WARMUP + 1, 299, 300, 301, 340, 599]:
        np.testing.assert_allclose(feats[t].numpy(), numpy_features(p, t, sigma), rtol=1e-6, atol=1e-6)
    assert feats[300, 39] == 5.0 and feats[301, 38] == 5.0
    env = MarketEnv(prices, 3, "cpu", seed=1)
    obs = env.reset()
    assert torch.equal(obs[:, :48], feats[env.bar])


def test_truncation_after_episode_len_and_auto_reset():
    env = MarketEnv(synthetic_prices(1000, 1), 4, "cpu", seed=2, episode_len=5)
    env.reset()
    starts = env.bar.clone()
    for k in range(1, 6):
        step = env.step(torch.full((4,), 30))
        assert step.truncated.tolist() == [k == 5] * 4
    assert torch.allclose(step.next_obs[:, 48], POSITIONS[30].float().expand(4))
    assert step.next_obs[:, 50].tolist() == [1.0] * 4
    assert torch.equal(step.next_obs[:, :48], env.features[starts + 5])
    # The new episodes: flat, no previous reward, at a fresh start bar.
    assert step.obs[:, 48:].eq(0).all()
    assert torch.equal(step.obs[:, :48], env.features[env.bar])
    assert ((env.bar >= WARMUP) & (env.bar <= 1000 - 1 - 5)).all()
    assert env.steps.eq(0).all() and env.position.eq(0).all()


def test_determinism_by_seed():
    prices = synthetic_prices(3000, 0)
    a, b, c = (MarketEnv(prices, 16, "cpu", seed=s, episode_len=20) for s in (7, 7, 8))
    assert torch.equal(a.bar, b.bar) and not torch.equal(a.bar, c.bar)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        actions = torch.randint(0, 45, (16,), generator=g)
        sa, sb = a.step(actions), b.step(actions)
        for x, y in zip(sa, sb, strict=True):
            assert torch.equal(x, y)
    saved = a.state_dict()
    then = [a.step(torch.full((16,), 40)) for _ in range(30)]
    a.load_state_dict(saved)
    for want in then:
        assert torch.equal(a.step(torch.full((16,), 40)).obs, want.obs)


def test_synthetic_prices():
    for kind in ("regime", "ou"):
        p = synthetic_prices(5000, 0, kind)
        assert p.shape == (5000,) and p.dtype == torch.float64 and (p > 0).all()
        assert p[0] == 100.0
        assert torch.equal(p, synthetic_prices(5000, 0, kind))
        assert not torch.equal(p, synthetic_prices(5000, 1, kind))
        assert 0.008 < return_std(p) < 0.013
    with pytest.raises(ValueError, match="unknown synthetic kind"):
        synthetic_prices(100, 0, "gbm")


@pytest.mark.parametrize(("kind", "sign"), [("regime", 1), ("ou", -1)])
def test_synthetic_kinds_carry_their_signal(kind, sign):
    """Past 20-bar returns predict the next 20 bars: positively with regimes, negatively with reversion."""
    r = torch.diff(synthetic_prices(40_000, 5, kind).log())
    past = r.unfold(0, 20, 20)[:-1].sum(1)
    future = r.unfold(0, 20, 20)[1:].sum(1)
    corr = torch.corrcoef(torch.stack((past, future)))[0, 1].item()
    assert sign * corr > 0.05


def write_csv(path, closes, header="Timestamp,Open,High,Low,Close,Volume,Extra"):
    start = datetime(2024, 1, 1)
    lines = [header] + [
        f"{(start + timedelta(minutes=i)).isoformat()},{c},{c * 1.01},{c * 0.99},{c},10,x" for i, c in enumerate(closes)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_bars_csv(tmp_path):
    closes = tiny_prices(100).tolist()
    path = write_csv(tmp_path / "bars.csv", closes)
    loaded = load_bars_csv(path)
    assert loaded.dtype == torch.float64 and loaded.tolist() == closes


@pytest.mark.parametrize(
    ("header", "bad_cell", "message"),
    [
        ("timestamp,open,high,low,close", None, "missing column.*volume"),
        ("timestamp,open,high,low,close,volume,extra", "abc", "line 4: close 'abc' is not a number"),
        ("timestamp,open,high,low,close,volume,extra", "0", "line 4: close '0' is not a finite positive price"),
        ("timestamp,open,high,low,close,volume,extra", "-2", "not a finite positive price"),
        ("timestamp,open,high,low,close,volume,extra", "nan", "not a finite positive price"),
    ],
)
def test_load_bars_csv_errors(tmp_path, header, bad_cell, message):
    path = write_csv(tmp_path / "bars.csv", tiny_prices(60).tolist(), header=header)
    if bad_cell is not None:
        lines = path.read_text().splitlines()
        cells = lines[3].split(",")
        cells[4] = bad_cell
        lines[3] = ",".join(cells)
        path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message):
        load_bars_csv(path)


def test_load_bars_csv_missing_file_and_too_few_rows(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_bars_csv(tmp_path / "nope.csv")
    path = write_csv(tmp_path / "short.csv", tiny_prices(30).tolist())
    with pytest.raises(ValueError, match="30 bars, at least 42 needed"):
        load_bars_csv(path, min_rows=42)
    with pytest.raises(ValueError, match=r"at least \d+ needed"):
        MarketEnv.from_source(1, "cpu", data=str(path))


def test_csv_splits(tmp_path):
    closes = tiny_prices(500)
    path = write_csv(tmp_path / "bars.csv", closes.tolist())
    train = MarketEnv.from_source(2, "cpu", data=str(path), split="train")
    test = MarketEnv.from_source(1, "cpu", data=str(path), split="test", random_start=False)
    assert torch.equal(train.prices, closes[:400])
    assert train.sigma == test.sigma == return_std(closes[:400])
    # The test env's first decision is at the last train bar and earns the first held-out return.
    assert torch.equal(test.prices[WARMUP:], closes[399:])
    test.reset()
    test.step(torch.tensor([44]))
    # a bar file is real bars: 2 bp a unit traded by default
    assert test.cost_bps == 2.0
    assert test.last_log_pnl.item() == pytest.approx(math.log(closes[400] / closes[399]) - 2e-4)


def test_synthetic_splits_are_held_out():
    kw = dict(n_bars=4000, test_bars=1000)
    train = MarketEnv.from_source(1, "cpu", seed=0, split="train", **kw)
    test = MarketEnv.from_source(1, "cpu", seed=0, split="test", **kw)
    assert (len(train.prices), len(test.prices)) == (4000, 1000)
    assert not torch.equal(train.prices[:1000], test.prices)
    assert train.sigma == test.sigma == return_std(synthetic_prices(4000, 0))
    assert torch.equal(test.prices, MarketEnv.from_source(1, "cpu", seed=0, split="test", **kw).prices)
    assert not torch.equal(test.prices, MarketEnv.from_source(1, "cpu", seed=1, split="test", **kw).prices)
    with pytest.raises(ValueError, match="split"):
        MarketEnv.from_source(1, "cpu", split="valid")
    with pytest.raises(ValueError, match="test_bars must be >= 42"):
        MarketEnv.from_source(1, "cpu", n_bars=4000, test_bars=10)


def test_evaluate_oracle_beats_buy_and_hold_and_flat():
    env = MarketEnv.from_source(1, "cpu", seed=0, n_bars=4000, test_bars=1000, split="test")
    future = env.returns[WARMUP + 1 :].tolist()
    calls = iter(range(len(future)))

    def oracle(obs: torch.Tensor) -> torch.Tensor:
        return torch.tensor([44 if future[next(calls)] > 0 else 0])

    result = evaluate(oracle, env)
    assert result["bars"] == len(future) == 1000 - WARMUP - 1
    assert result["total_log_pnl"] > max(result["buy_and_hold_log_pnl"], result["flat_log_pnl"]) + 1.0
    assert result["sharpe_per_bar"] > 0.5
    assert result["turnover"] > 1.0


def test_evaluate_buy_and_hold_is_the_sum_of_log_returns_minus_entry_cost():
    prices = tiny_prices(300, seed=4)
    expected = math.log(prices[-1] / prices[WARMUP]) - 2e-4
    always_long = lambda obs: torch.full((obs.shape[0],), 44)
    result = evaluate(always_long, prices, cost_bps=2.0)
    assert result["buy_and_hold_log_pnl"] == pytest.approx(expected, rel=1e-9)
    assert result["total_log_pnl"] == pytest.approx(expected, rel=1e-9)
    assert result["turnover"] == 1.0 and result["flat_log_pnl"] == 0.0
    assert result["sharpe_per_bar"] == pytest.approx(result["buy_and_hold_sharpe_per_bar"])
    flat = evaluate(lambda obs: torch.full((1,), 22), prices)
    assert flat["total_log_pnl"] == 0.0 and flat["turnover"] == 0.0 and flat["sharpe_per_bar"] == 0.0


def test_bad_arguments():
    with pytest.raises(ValueError, match=f"at least {MIN_BARS} bars"):
        MarketEnv(tiny_prices(MIN_BARS - 1), 1, "cpu")
    with pytest.raises(ValueError, match="finite and positive"):
        MarketEnv(torch.full((100,), -1.0, dtype=torch.float64), 1, "cpu")
    with pytest.raises(ValueError, match="episode_len"):
        MarketEnv(tiny_prices(), 1, "cpu", episode_len=0)
    with pytest.raises(ValueError, match="int64"):
        MarketEnv(tiny_prices(), 2, "cpu").step(torch.zeros(2, dtype=torch.int32))


def test_runs_on_any_device(device):
    env = MarketEnv(synthetic_prices(2000, 0), 64, device, seed=0, episode_len=32)
    for _ in range(100):
        step = env.step(torch.randint(0, 45, (64,), device=device))
    assert step.obs.device.type == device.type and step.obs.shape == (64, 51)


def test_a_coarse_action_set_short_flat_long():
    """n_actions=3: positions -1, 0, +1, the same P&L and cost accounting as the 45 actions'."""
    assert action_positions(3).tolist() == [-1.0, 0.0, 1.0]
    assert torch.equal(action_positions(45), POSITIONS) and action_positions(5).tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0]
    for bad in (2, 4, 1, True, 3.0, "3"):
        with pytest.raises(ValueError, match="odd integer >= 3"):
            action_positions(bad)
    with pytest.raises(ValueError, match="odd integer >= 3"):
        MarketEnv(tiny_prices(), 1, "cpu", n_actions=4)
    prices = tiny_prices()
    env = MarketEnv(prices, 1, "cpu", episode_len=100, cost_bps=2.0, random_start=False, sigma=0.02, n_actions=3)
    env.reset()
    assert env.n_actions == 3 and MarketEnv.n_actions == N_ACTIONS  # the instance's, the class default untouched
    p, position = prices.tolist(), 0.0
    for i, a in enumerate([2, 0, 1, 2]):
        t, target = WARMUP + i, float(a - 1)
        env.step(torch.tensor([a]))
        want = target * math.log(p[t + 1] / p[t]) - 2e-4 * abs(target - position)
        assert env.last_log_pnl.item() == pytest.approx(want, rel=1e-12, abs=1e-15)
        position = target


def test_evaluate_walks_the_sources_actions():
    """evaluate() of a 3-action environment trades its three positions: always action 2 is long,
    buy-and-hold's P&L; always action 1 is flat."""
    env = MarketEnv(synthetic_prices(400, 1), 1, "cpu", n_actions=3, cost_bps=2.0)
    long = evaluate(lambda obs: torch.full((obs.shape[0],), 2), env)
    assert long["total_log_pnl"] == pytest.approx(long["buy_and_hold_log_pnl"], rel=1e-12)
    flat = evaluate(lambda obs: torch.full((obs.shape[0],), 1), env)
    assert flat["total_log_pnl"] == 0.0 and flat["turnover"] == 0.0


def test_volatility_targeting_holds_the_chosen_position_times_the_bars_scale():
    """vol_scale: p' s_t units held, costs on the change of units, feature 48 the chosen p'; NaN
    scales hold nothing; a truncated episode starts flat again."""
    prices = tiny_prices()
    n = len(prices)
    scale = np.linspace(0.5, 2.0, n)
    scale[WARMUP + 2] = np.nan  # unknown volatility: no position there
    env = MarketEnv(prices, 1, "cpu", episode_len=100, cost_bps=3.0, random_start=False, sigma=0.02, vol_scale=scale)
    obs = env.reset()
    assert obs[0, 48] == 0 and env.vol_scale[WARMUP + 2] == 0
    p, held_before = prices.tolist(), 0.0
    for i, a in enumerate([44, 11, 0, 22]):
        t = WARMUP + i
        target = -1.0 + 2.0 * a / 44
        held = target * (0.0 if t == WARMUP + 2 else scale[t])
        step = env.step(torch.tensor([a]))
        want = held * math.log(p[t + 1] / p[t]) - 3e-4 * abs(held - held_before)
        assert env.last_log_pnl.item() == pytest.approx(want, rel=1e-12, abs=1e-15)
        assert env.last_traded.item() == pytest.approx(abs(held - held_before), abs=1e-15)
        assert step.next_obs[0, 48].item() == pytest.approx(target)
        held_before = held
    assert step.truncated.item() and env.exposure.item() == 0.0 and env.position.item() == 0.0
    state = env.state_dict()
    assert "exposure" in state and "exposure" not in MarketEnv(prices, 1, "cpu").state_dict()
    for bad, match in ((np.ones(n - 1), "one value a bar"), (-np.ones(n), ">= 0")):
        with pytest.raises(ValueError, match=match):
            MarketEnv(prices, 1, "cpu", vol_scale=bad)


def test_a_scale_of_one_is_no_scale_bit_for_bit():
    prices = synthetic_prices(600, 2)
    plain = MarketEnv(prices, 4, "cpu", seed=5, cost_bps=2.0)
    ones = MarketEnv(prices, 4, "cpu", seed=5, cost_bps=2.0, vol_scale=np.ones(len(prices)))
    plain.reset(), ones.reset()
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        a = torch.randint(0, 45, (4,), generator=g)
        x, y = plain.step(a), ones.step(a)
        assert torch.equal(x.reward, y.reward) and torch.equal(x.next_obs, y.next_obs)
        assert torch.equal(plain.last_log_pnl, ones.last_log_pnl) and torch.equal(plain.last_traded, ones.last_traded)


def test_from_source_scales_each_split_by_the_volatility_up_to_each_bar(tmp_path):
    closes = tiny_prices(600, 3).tolist()
    path = write_csv(tmp_path / "bars.csv", closes)
    full = vol.volatility_scale(np.array(closes), 0.15)
    train = MarketEnv.from_source(1, "cpu", data=str(path), split="train", vol_target=0.15)
    test = MarketEnv.from_source(1, "cpu", data=str(path), split="test", vol_target=0.15)
    finite = np.where(np.isfinite(full), full, 0.0)
    assert torch.equal(train.vol_scale, torch.from_numpy(finite[: train.n_bars]))
    assert torch.equal(test.vol_scale, torch.from_numpy(finite[-test.n_bars :]))
    assert (test.vol_scale > 0).all()  # the test split's first bars have the training bars' history
    assert MarketEnv.from_source(1, "cpu", data=str(path), split="test").vol_scale is None
    # evaluate() walks the source's scale: always long holds s_t units each bar
    long = evaluate(lambda obs: torch.full((obs.shape[0],), 44), test)
    held = test.vol_scale[WARMUP:-1].double()
    r = test.returns[WARMUP + 1 :]
    want = float((held * r).sum() - test.cost * torch.diff(held, prepend=held.new_zeros(1)).abs().sum())
    assert long["total_log_pnl"] == pytest.approx(want, rel=1e-10)


def test_a_turnover_penalty_lowers_the_reward_not_the_pnl():
    prices = tiny_prices()
    plain = MarketEnv(prices, 1, "cpu", episode_len=100, cost_bps=2.0, random_start=False, sigma=0.02)
    taxed = MarketEnv(prices, 1, "cpu", episode_len=100, cost_bps=2.0, random_start=False, sigma=0.02, turnover_bps=5)
    plain.reset(), taxed.reset()
    for a in (44, 44, 0, 22):
        x, y = plain.step(torch.tensor([a])), taxed.step(torch.tensor([a]))
        assert torch.equal(plain.last_log_pnl, taxed.last_log_pnl)
        want = (taxed.last_log_pnl - 5e-4 * taxed.last_traded) / 0.02
        assert y.reward.item() == pytest.approx(want.item(), rel=1e-6)
        assert (y.reward == x.reward).item() == (taxed.last_traded.item() == 0)
    with pytest.raises(ValueError, match="turnover_bps must be >= 0"):
        MarketEnv(prices, 1, "cpu", turnover_bps=-1.0)


@pytest.mark.gpu
def test_a_captured_step_of_three_scaled_actions_replays_as_eager_steps():
    """n_actions, vol_scale and turnover_bps on CUDA: a step captured in a graph, replayed from the
    eager environment's state, earns what the eager step earns (episodes end and restart between)."""
    from gper.replay.graphs import capture

    prices = synthetic_prices(600, 3)
    kw = dict(seed=0, episode_len=16, random_start=False, n_actions=3, cost_bps=2.0, turnover_bps=3.0)
    kw["vol_scale"] = vol.volatility_scale(prices.double().numpy(), 0.15)
    graphed, eager = MarketEnv(prices, 8, "cuda", **kw), MarketEnv(prices, 8, "cuda", **kw)
    graphed.reset(), eager.reset()
    actions = torch.zeros(8, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graphed.step(actions)  # allocate and load kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        out = graphed.step(actions)
    graphed.load_state_dict(eager.state_dict())
    draw = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(40):
        actions.copy_(torch.randint(0, 3, (8,), device="cuda", generator=draw))
        graph.replay()
        want = eager.step(actions)
        for got, expected in zip(out, want, strict=True):
            assert torch.equal(got, expected)
        for name in ("last_log_pnl", "last_traded", "exposure", "position", "bar"):
            assert torch.equal(getattr(graphed, name), getattr(eager, name)), name

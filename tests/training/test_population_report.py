"""A population through the trainer core: N scripted agents, each its own block of environments,
reported per agent (metrics.jsonl, TensorBoard, solve points, summary.json) and in aggregate
(the IQM of the final means, against a plain-Python oracle), resumed as the uninterrupted run; a
single agent's record as it has always been."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types

import pytest
import torch

import gper
from gper.training import AlgorithmSpec, RunConfig, train
from gper.training.episodes import EpisodeTracker
from gper.training.plot import figure
from gper.training.population_stats import iqm, iqm_interval
from gper.training.runlog import read_metrics
from gper.training.tensorboard import installed
from helpers import event_scalars

# ---- a scripted population: agent i's environment j ends an episode every 4 + i + j steps; a step
# of collection iteration t pays (i + 1) (t + 1) / 1000, so later episodes and higher agents earn more


@dataclasses.dataclass
class PopConfig(RunConfig):
    agents: int = 8  # the IQM keeps the middle 4


def _length(agent: int, env: int) -> int:
    return 4 + agent + env


class ScriptedPopulation:
    """A learner of ``cfg.agents`` agents (none of the ``agents`` attribute for one) whose episodes
    are scripted; its sums are (agent + 1) / 2 and 1 per training step, its replay holds the rewards."""

    def __init__(self, cfg: PopConfig) -> None:
        n, e = cfg.agents, cfg.num_envs
        self.device = torch.device("cpu")
        if n > 1:
            self.agents = n
        self.episodes = EpisodeTracker(n * e, self.device, agents=n)
        envs = torch.arange(n * e)
        self.agent = (envs // e).double()
        self.limit = torch.tensor([_length(k // e, k % e) for k in range(n * e)], dtype=torch.float64)
        self.length = torch.zeros(n * e, dtype=torch.float64)
        self.t = torch.zeros((), dtype=torch.float64)
        self.e = e
        self.sums = torch.zeros((n, 2) if n > 1 else (2,), dtype=torch.float64)
        self.rb = gper.PrioritizedReplayBuffer(256, {"x": ((), torch.float32)}, device=self.device, seed=0)

    def collect_step(self, timer) -> None:
        reward = (self.agent + 1.0) * (self.t + 1.0) / 1000.0
        self.length += 1
        done = self.length >= self.limit
        self.length *= ~done
        self.t += 1
        self.rb.add({"x": reward.float()})
        self.episodes.record(reward, done, self.t * self.e)  # the per-agent env step

    def learn_step(self, train_step: int, timer) -> None:
        per_agent = torch.stack([(self.agent[:: self.e] + 1) / 2, torch.ones_like(self.agent[:: self.e])], dim=1)
        self.sums += per_agent if self.sums.dim() == 2 else per_agent[0]

    def device_values(self) -> dict[str, torch.Tensor]:
        return {}

    def after_sync(self) -> None:
        pass

    def charts(self, host, env_step: int) -> dict[str, float]:
        return {"charts/epsilon": 0.1}

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.int64)

    def state_dict(self, *, replay: bool) -> dict:
        return {"length": self.length, "t": self.t, "sums": self.sums, "episodes": self.episodes.state_dict()}

    def load_state_dict(self, state: dict, *, replay: bool) -> None:
        for name in ("length", "t", "sums"):
            getattr(self, name).copy_(state[name])
        self.episodes.load_state_dict(state["episodes"])

    def honour_settings(self) -> None:
        pass


POP = AlgorithmSpec(
    "scripted-population", PopConfig, lambda cfg, log, launch: (cfg, ScriptedPopulation(cfg), []), {0: "losses/td_loss"}
)


def _config(tmp_path, **changes) -> PopConfig:
    base = dict(run_dir=str(tmp_path), num_envs=2, total_steps=2400, keep_checkpoints=10, solve_return=30.0)
    return PopConfig(**base | dict(learning_starts=100, tensorboard=installed()) | changes)


# ---- the oracle: the script stepped in plain Python


def _oracle(cfg: PopConfig) -> list[list[tuple[float, int, int]]]:
    """Each agent's (return, length, env step) in order."""
    n, e = cfg.agents, cfg.num_envs
    episodes: list[list[tuple[float, int, int]]] = [[] for _ in range(n)]
    running = [[0.0, 0] for _ in range(n * e)]
    for t in range(math.ceil(cfg.total_steps / e)):
        for k in range(n * e):
            agent = k // e
            running[k][0] += (agent + 1) * (t + 1) / 1000
            running[k][1] += 1
            if running[k][1] == _length(agent, k % e):
                episodes[agent].append((running[k][0], running[k][1], (t + 1) * e))
                running[k] = [0.0, 0]
    return episodes


def _solved_at(episodes: list[tuple[float, int, int]], goal: float) -> int | None:
    returns = [r for r, _, _ in episodes]
    return next(
        (episodes[k - 1][2] for k in range(100, len(returns) + 1) if sum(returns[k - 100 : k]) / 100 >= goal), None
    )


def _iqm_oracle(values: list[float]) -> float:
    """rliable's IQM (scipy's trim_mean at 0.25): cut floor(n/4) from each end, average the rest."""
    s = sorted(values)
    cut = len(s) // 4
    return sum(s[cut : len(s) - cut]) / (len(s) - 2 * cut)


def _no_rliable(monkeypatch):
    monkeypatch.setitem(sys.modules, "rliable", None)  # import rliable raises ImportError


# ---- the tests


def test_a_population_is_reported_per_agent_and_in_aggregate(tmp_path, monkeypatch):
    _no_rliable(monkeypatch)
    lines: list[str] = []
    cfg = _config(tmp_path, run_name="pop")
    results = train(POP, cfg, log=lines.append)
    folder, expected = tmp_path / "pop", _oracle(cfg)
    rows = read_metrics(folder / "metrics.jsonl")
    for agent, eps in enumerate(expected):
        name = f"agent_{agent}/charts/episodic_return"
        got = [(r[name], r[f"agent_{agent}/charts/episodic_length"], r["global_step"]) for r in rows if name in r]
        assert got == eps, agent
    assert not any("charts/episodic_return" in r for r in rows)  # every episode is an agent's
    assert [r["global_step"] for r in rows] == sorted(r["global_step"] for r in rows)

    means = [sum(r for r, _, _ in eps[-100:]) / 100 for eps in expected]
    solved = [_solved_at(eps, 30.0) for eps in expected]
    assert 0 < sum(s is not None for s in solved) < cfg.agents  # some agents solve, some do not
    pop = json.loads((folder / "summary.json").read_text())["population"]
    assert pop["iqm_return_last100"] == pytest.approx(_iqm_oracle(means), rel=1e-12)
    assert pop["mean_return_last100"] == pytest.approx(sum(means) / len(means), rel=1e-12)
    assert pop["agents"] == pop["agents_counted"] == 8 and pop["agents_solved"] == sum(s is not None for s in solved)
    assert pop["iqm_ci95"] is None and pop["iqm_ci"].startswith("left out: it needs rliable")
    assert [a["solved_at_step"] for a in pop["per_agent"]] == solved
    assert [a["mean_return_last100"] for a in pop["per_agent"]] == pytest.approx(means, rel=1e-12)
    assert [a["episodes"] for a in pop["per_agent"]] == [len(eps) for eps in expected]
    assert results.episodes == sum(len(eps) for eps in expected) and results.solved_at_step is None  # not all solved

    epochs = [r for r in rows if "charts/SPS" in r]
    assert [r["global_step"] for r in epochs] == [2000, 2400]
    last = epochs[-1]
    assert last["charts/iqm_return_last100"] == pytest.approx(_iqm_oracle(means), rel=1e-12)
    assert last["charts/agents_solved"] == pop["agents_solved"]
    assert [last[f"agent_{a}/losses/td_loss"] for a in range(8)] == [(a + 1) / 2 for a in range(8)]
    assert last["losses/td_loss"] == pytest.approx(sum((a + 1) / 2 for a in range(8)) / 8)
    line = next(x for x in lines if x.startswith("step      2400"))
    assert f"iqm {_iqm_oracle(means):8.2f}  solved {pop['agents_solved']}/8" in line

    # the plot: every agent's 100-episode mean thin, the IQM at the epochs' ends bold in its band
    ret = figure(rows, solve_return=30.0).axes[0]
    drawn = {line.get_label(): line for line in ret.lines}
    assert len([line for line in ret.lines if line.get_lw() < 1]) == 8
    bold = drawn["IQM across 8 agents"]
    assert list(bold.get_xdata()) == [2000, 2400]
    assert list(bold.get_ydata()) == pytest.approx([r["charts/iqm_return_last100"] for r in epochs], rel=1e-12)
    assert [c.get_label() for c in ret.collections] == ["interquartile range of the agents"]
    assert "solved: 30" in drawn and (folder / "plot.png").stat().st_size > 10_000

    if installed():  # TensorBoard: the agents' tags, at the episodes' steps
        scalars = event_scalars(folder)
        assert [s for s, _ in scalars["agent_3/charts/episodic_return"]] == [s for _, _, s in expected[3]]
        assert "agent_5/charts/mean_return_last100" in scalars and "charts/iqm_return_last100" in scalars


def test_a_resumed_population_reports_as_the_uninterrupted_one(tmp_path, monkeypatch):
    _no_rliable(monkeypatch)
    train(POP, _config(tmp_path, run_name="whole"), log=lambda _: None)
    first = tmp_path / "whole" / "checkpoints" / "step-000000002000"
    train(POP, _config(tmp_path, run_name="resumed", resume=str(first)), log=lambda _: None)

    def untimed(name: str) -> list[dict]:
        rows = read_metrics(tmp_path / name / "metrics.jsonl")
        clock = ("charts/SPS", "charts/train_steps_per_s")
        return [{k: v for k, v in r.items() if k not in clock and not k.startswith("timing/")} for r in rows]

    assert untimed("resumed") == untimed("whole")
    whole, resumed = (
        json.loads((tmp_path / n / "summary.json").read_text())["population"] for n in ("whole", "resumed")
    )
    for pop in (whole, resumed):
        for agent in pop["per_agent"]:
            agent.pop("solved_at_s")  # the clock's
    assert resumed == whole and whole["agents_solved"] > 0


def test_one_agent_writes_the_record_it_always_has(tmp_path):
    cfg = _config(tmp_path, run_name="one", agents=1)
    lines: list[str] = []
    results = train(POP, cfg, log=lines.append)
    rows = read_metrics(tmp_path / "one" / "metrics.jsonl")
    got = [(r["charts/episodic_return"], r["charts/episodic_length"], r["global_step"]) for r in rows if len(r) == 3]
    assert got == _oracle(cfg)[0]
    assert not any(k.startswith("agent_") or k == "charts/iqm_return_last100" for r in rows for k in r)
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert "population" not in summary and results.population is None
    assert any(x.startswith("step      2400  return(last100) ") and "  episodes " in x for x in lines)


def test_a_learner_that_breaks_the_population_contract_is_refused(tmp_path):
    class Wrong(ScriptedPopulation):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.episodes = EpisodeTracker(cfg.num_envs * cfg.agents, self.device)  # no agents=

    spec = dataclasses.replace(POP, setup=lambda cfg, log, launch: (cfg, Wrong(cfg), []))
    with pytest.raises(TypeError, match="needs EpisodeTracker\\(2 \\* 8, device, agents=8\\)"):
        train(spec, _config(tmp_path), log=lambda _: None)
    assert not list(tmp_path.iterdir())  # refused before the run folder was made


def test_the_iqm_matches_the_oracle_and_trims_as_rliable():
    skewed = ([1.0], [3.0, 1.0], [10.0, 1, 2, 3], [5.0, 1, 9, 2, 70], [0.0, 1, 2, 3, 4, 5, 60, 100], [9.0] * 8 + [0.0])
    for values, expected in zip(skewed, (1.0, 2.0, 2.5, 16 / 3, 3.5, 9.0), strict=True):
        assert iqm(values) == pytest.approx(_iqm_oracle(values)) == pytest.approx(expected), values
    assert iqm([1.0, float("nan"), 3.0]) == 2.0 and math.isnan(iqm([]))
    scipy_stats = pytest.importorskip("scipy.stats")
    for values in ([0.3, 7.0, -2.0, 4.5, 11.0, 1.0, 2.5], [0.0, 1, 2, 3, 4, 5, 60, 100]):
        assert iqm(values) == pytest.approx(float(scipy_stats.trim_mean(values, 0.25))), values


def test_the_interval_goes_through_rliables_stratified_bootstrap(monkeypatch):
    """rliable's call (scores agents x 1 task, the IQM as the aggregate, a seeded RandomState),
    checked against a stand-in module; a failing rliable leaves the interval out, saying why."""
    np = pytest.importorskip("numpy")
    calls = []

    def get_interval_estimates(scores, func, reps, confidence_interval_size, random_state):
        calls.append((scores["population"].shape, reps, confidence_interval_size, random_state.randint(1 << 30)))
        point = func(scores["population"])
        return {"population": point}, {"population": np.array([[point[0] - 1], [point[0] + 1]])}

    library = types.SimpleNamespace(get_interval_estimates=get_interval_estimates)
    metrics = types.SimpleNamespace(aggregate_iqm=lambda x: _iqm_oracle(list(x.ravel())))
    fake = types.ModuleType("rliable")
    fake.library, fake.metrics = library, metrics
    monkeypatch.setitem(sys.modules, "rliable", fake)
    monkeypatch.setitem(sys.modules, "rliable.library", library)
    monkeypatch.setitem(sys.modules, "rliable.metrics", metrics)
    interval, how = iqm_interval([1.0, 2.0, 3.0, 4.0, float("nan")], seed=7, reps=500)
    assert interval == [1.5, 3.5] and "stratified bootstrap" in how and "seed 7" in how
    assert calls == [((4, 1), 500, 0.95, np.random.RandomState(7).randint(1 << 30))]

    def broken(*args, **kwargs):
        raise TypeError("random_state has type RandomState")

    library.get_interval_estimates = broken
    assert iqm_interval([1.0, 2.0]) == (None, "left out: rliable failed: TypeError: random_state has type RandomState")
    assert iqm_interval([1.0])[0] is None


def test_an_epochs_episodes_are_recorded_by_step_then_agent_then_ring_order(tmp_path):
    """The epoch report from the drained rows: metrics.jsonl holds a step's episodes by agent and an
    agent's in the order the ring recorded them (two of one agent at one step too), each agent's
    returns follow its own order, and an agent without episodes gets none (a plain-Python oracle)."""
    from gper.training.population_report import PopulationReport
    from gper.training.runlog import RunLog

    agents = 4
    # (return, length, env step, agent) in ring order: steps interleaved, ties across and within agents
    ring = [(5.0, 5, 20, 2), (1.0, 1, 10, 3), (2.0, 2, 10, 0), (7.5, 7, 20, 0), (3.0, 3, 10, 3), (4.0, 4, 20, 2)]
    tracker = EpisodeTracker(agents * 2, torch.device("cpu"), agents=agents)
    tracker.table[: len(ring)] = torch.tensor(ring, dtype=tracker.table.dtype)
    host = {"episodes": tracker.table, "episode_count": torch.tensor(len(ring))}
    log = RunLog(tmp_path)
    report = PopulationReport(RunConfig(env="x", num_envs=2), torch.device("cpu"), log, [], print, agents=agents)
    episodes, lost = report.drain(tracker, host)
    report._record_episodes(episodes, lost)
    report._windows(episodes, 0.0)
    log.close()
    order = sorted(range(len(ring)), key=lambda i: (ring[i][2], ring[i][3], i))
    want = [
        {"global_step": ring[i][2], f"agent_{ring[i][3]}/charts/episodic_return": ring[i][0],
         f"agent_{ring[i][3]}/charts/episodic_length": ring[i][1]}
        for i in order
    ]  # fmt: skip
    assert read_metrics(tmp_path / "metrics.jsonl") == want
    assert report.returns == [ring[i][0] for i in order] and report.episode_agents == [ring[i][3] for i in order]
    assert report.agent_returns == [[2.0, 7.5], [], [5.0, 4.0], [1.0, 3.0]]
    assert lost == 0 and report.agent_best == [-math.inf] * agents  # no 100-episode window yet

"""What a population reports: N agents trained at once in one process, each reported on its own
and all of them in aggregate (:mod:`~gper.training.population_stats`).

A learner is a population when it has an int attribute ``agents`` > 1 (:func:`population_of`
checks the rest of the contract): its :attr:`~gper.training.algorithm.Learner.episodes` is an
``EpisodeTracker(num_envs * agents, device, agents=agents)`` whose environments ``[i*E, (i+1)*E)``
are agent ``i``'s (``E``: the run's ``num_envs``, per agent), recording the *per-agent* env step
(collection iterations × ``E``, the run's env-step axis); its ``sums`` are ``[agents, n_sums]``,
agent ``i``'s running sums in row ``i``.

The record (``metrics.jsonl`` and TensorBoard, the same names):

- an episode of agent ``i``: ``{"global_step": s, "agent_<i>/charts/episodic_return": r,
  "agent_<i>/charts/episodic_length": n}``;
- the epoch row: ``charts/SPS`` (env steps/s of all agents together), the learner's charts,
  ``charts/mean_return_last100`` (the mean over the agents of their 100-episode means),
  ``charts/iqm_return_last100`` (their interquartile mean), ``charts/agents_solved``,
  ``agent_<i>/charts/mean_return_last100``, each sum metric as the mean over the agents and as
  ``agent_<i>/<name>``, and the phase times.

``summary.json``'s ``population`` holds the aggregate (:func:`~gper.training.population_stats.population_summary`:
the IQM of the final means with its 95% interval, how many agents solved) and ``per_agent``: each
agent's episodes, final and best 100-episode mean and solve point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from gper.training.episodes import split_by_agent
from gper.training.population_stats import iqm, mean, population_summary
from gper.training.report import Results, RunReport, mean_last100, scan_windows
from gper.training.runlog import RunLog
from gper.training.settings import RunSettings


class Episodes(NamedTuple):
    """A population's episodes of an epoch, as columns: a population can finish 10^5 an epoch."""

    rows: np.ndarray
    """float64 rows (return, length, env step, agent) in the order the ring recorded them
    (:meth:`~gper.training.episodes.EpisodeTracker.drain_rows`)"""
    by_agent: list[np.ndarray]
    """``rows`` split by agent: entry ``i`` holds agent ``i``'s, in the order they were recorded"""


def population_of(learner: Any, num_envs: int) -> int:
    """The agents of ``learner`` (1 without an ``agents`` attribute), once its episodes and sums are
    checked to be a population's of that many (see the module docstring).

    Raises:
        TypeError: ``agents`` is not an int >= 1, or the tracker or the sums do not fit it.
    """
    agents = getattr(learner, "agents", 1)
    if isinstance(agents, bool) or not isinstance(agents, int) or agents < 1:
        raise TypeError(f"a learner's agents must be an int >= 1, got {agents!r}")
    if agents == 1:
        return 1
    tracker, sums = learner.episodes, learner.sums
    if getattr(tracker, "agents", 1) != agents or tracker.num_envs != num_envs * agents:
        raise TypeError(
            f"a population of {agents} agents needs EpisodeTracker({num_envs} * {agents}, device, agents={agents}), "
            f"got one of {tracker.num_envs} environments and {getattr(tracker, 'agents', 1)} agent(s)"
        )
    if sums.dim() != 2 or sums.shape[0] != agents:
        raise TypeError(f"a population's sums are [agents, n_sums] = [{agents}, ...], got {list(sums.shape)}")
    return agents


class PopulationReport(RunReport):
    """A :class:`~gper.training.report.RunReport` for ``agents`` agents (see the module docstring);
    the arguments as :class:`~gper.training.report.RunReport`'s, ``returns`` being all the agents'
    episodes in the order they were recorded (the checkpoint's; :meth:`load_state_dict` sorts them
    back to their agents)."""

    def __init__(
        self,
        cfg: RunSettings,
        device: torch.device,
        runlog: RunLog,
        returns: list[float],
        log: Callable[[str], object],
        sum_metrics: Mapping[int, str] | None = None,
        learn_phases: tuple[str, ...] = (),
        *,
        agents: int,
    ) -> None:
        super().__init__(cfg, device, runlog, returns, log, sum_metrics, learn_phases)
        self.agents = agents
        self.episode_agents: list[int] = []
        """the agent of each entry of ``returns``"""
        self.agent_returns: list[list[float]] = [[] for _ in range(agents)]
        self.agent_best = [-math.inf] * agents
        """each agent's best 100-episode mean"""
        self.agent_solved: list[tuple[int, float] | None] = [None] * agents
        """each agent's (env step, wall seconds) of its first 100-episode window at ``solve_return``"""

    def state_dict(self) -> dict[str, object]:
        """:meth:`RunReport.state_dict` and each agent's episodes (by index into ``returns``), best
        window and solve point."""
        return {
            **super().state_dict(),
            "episode_agents": list(self.episode_agents),
            "agent_best": list(self.agent_best),
            "agent_solved": list(self.agent_solved),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        self.episode_agents = [int(a) for a in state["episode_agents"]]
        if len(self.episode_agents) != len(self.returns):
            raise ValueError(f"{len(self.episode_agents)} episode agents for {len(self.returns)} returns")
        self.agent_returns = [[] for _ in range(self.agents)]
        for ret, agent in zip(self.returns, self.episode_agents, strict=True):
            self.agent_returns[agent].append(ret)
        self.agent_best = [float(b) for b in state["agent_best"]]
        self.agent_solved = [None if s is None else (int(s[0]), float(s[1])) for s in state["agent_solved"]]

    def drain(self, tracker: Any, host: dict[str, torch.Tensor]) -> tuple[Episodes, int]:
        """The epoch's episodes as rows (:meth:`~gper.training.episodes.EpisodeTracker.drain_rows`)
        and split by agent."""
        rows, lost = tracker.drain_rows(host)
        return Episodes(rows, split_by_agent(rows, self.agents)), lost

    def agent_means(self) -> list[float]:
        """Each agent's mean of its last 100 episodes (NaN for one without episodes)."""
        return [mean_last100(returns) for returns in self.agent_returns]

    def _record_episodes(self, episodes: Episodes, lost: int) -> None:
        if lost:
            self.log(f"gper train: {lost} finished episodes were not recorded (more than the ring holds in one epoch)")
        rows = episodes.rows
        agent, step = rows[:, 3].astype(np.int64), rows[:, 2].astype(np.int64)
        # in the order of their steps, as metrics.jsonl keeps its records: a step's by agent, and an
        # agent's in the order they were recorded
        order = np.lexsort((np.arange(len(rows)), agent, step))
        returns, agents = rows[order, 0].tolist(), agent[order].tolist()
        self.returns.extend(returns)
        self.episode_agents.extend(agents)
        for a, own in enumerate(episodes.by_agent):
            self.agent_returns[a].extend(own[:, 0].tolist())
        self.runlog.log_agent_episodes(step[order].tolist(), agents, returns, rows[order, 1].astype(np.int64).tolist())

    def _windows(self, episodes: Episodes, now: float) -> None:
        """Each agent's 100-episode windows that end in this epoch: its best, and its first at solve_return."""
        for agent, own in enumerate(episodes.by_agent):
            best, solved = scan_windows(self.agent_returns[agent], own[:, 2], self.cfg.solve_return)
            self.agent_best[agent] = max(self.agent_best[agent], best)
            if self.agent_solved[agent] is None and solved is not None:
                self.agent_solved[agent] = (solved, now - self.t0)

    def _return_metrics(self) -> dict[str, float]:
        means = self.agent_means()
        return {
            "charts/mean_return_last100": mean(means),
            "charts/iqm_return_last100": iqm(means),
            "charts/agents_solved": sum(s is not None for s in self.agent_solved),
            **{f"agent_{agent}/charts/mean_return_last100": m for agent, m in enumerate(means)},
        }

    def _return_said(self, metrics: dict[str, float]) -> str:
        solved = metrics["charts/agents_solved"]
        return (
            f"return(last100) mean {metrics['charts/mean_return_last100']:8.2f} "
            f"iqm {metrics['charts/iqm_return_last100']:8.2f}  solved {solved}/{self.agents}  "
            f"episodes {len(self.returns):6d}"
        )

    def _sum_metrics(self, host: dict[str, torch.Tensor], trained: int) -> dict[str, float]:
        """Each sum's mean per training step over the agents, and each agent's (none when it did not train)."""
        sums = host["sums"].clone()
        delta, self._sums = sums - self._sums, sums
        if not trained:
            return {}
        metrics = {}
        for slot, name in self.sum_metrics.items():
            per_agent = delta[:, slot] / trained
            metrics[name] = float(per_agent.mean())
            metrics.update({f"agent_{agent}/{name}": float(v) for agent, v in enumerate(per_agent)})
        return metrics

    def results(
        self,
        env_steps: int,
        train_steps: int,
        wall: float,
        evaluation: dict[str, float] | None,
        notes: list[str],
        stopped: str | None = None,
    ) -> Results:
        """:meth:`RunReport.results` with ``population`` (see the module docstring), and these
        fields over the agents: ``mean_return_last100``, the mean of their 100-episode means;
        ``best_mean_return_last100``, the best agent's best; ``solved_at_step`` and
        ``solved_at_s``, where the last agent to solve solved, when every agent did."""
        base = super().results(env_steps, train_steps, wall, evaluation, notes, stopped)
        means = self.agent_means()
        seed = self.cfg.seed if isinstance(self.cfg.seed, int) else 0
        steps = [None if s is None else s[0] for s in self.agent_solved]
        aggregate = population_summary(means, steps, self.cfg.solve_return, seed=seed)
        per_agent = [
            {
                "agent": agent,
                "episodes": len(self.agent_returns[agent]),
                "mean_return_last100": means[agent],
                "best_mean_return_last100": best if best > -math.inf else None,
                "solved_at_step": solved[0] if solved else None,
                "solved_at_s": solved[1] if solved else None,
            }
            for agent, (best, solved) in enumerate(zip(self.agent_best, self.agent_solved, strict=True))
        ]
        bests = [b for b in self.agent_best if b > -math.inf]
        last = max(self.agent_solved, key=lambda s: s[0]) if all(self.agent_solved) else None
        return dataclasses.replace(
            base,
            mean_return_last100=aggregate["mean_return_last100"],
            best_mean_return_last100=max(bests) if bests else None,
            solved_at_step=last[0] if last else None,
            solved_at_s=last[1] if last else None,
            population={**aggregate, "per_agent": per_agent},
        )

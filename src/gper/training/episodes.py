"""Episode returns and lengths kept on the device, so data collection never waits for the host.

Each environment's running return and length live in device tensors. When episodes end, their
(return, length, env step) rows go into a ring on the device at positions computed from a
device counter and a cumulative sum of the done flags; environments that did not finish write
to a spare row past the end. The host copies the ring and the counter once an epoch
(:meth:`EpisodeTracker.drain`) and reads the rows written since the last copy.

With an environment that resets on the *next* step (Gymnasium's ``next-step`` autoreset, see
:attr:`gper.envs.base.VecEnv.autoreset`), the step after an episode's end is a reset step that
belongs to no episode: the tracker remembers which copies ended on their last step and counts
neither the reset step's reward nor its length, so it records the episodes a ``same-step``
environment would.

A population (``agents`` > 1: N agents trained together, :mod:`gper.training.population_report`)
records all its environments in one tracker: environments ``[i*E, (i+1)*E)`` belong to agent ``i``
(``E = num_envs // agents``), and each ring row records its agent too, which
:meth:`EpisodeTracker.drain_agents` sorts the episodes by.

With ``kernels="triton"`` (the learners choose it on CUDA, with the replay's Triton kernels) a
step's record is one kernel (:mod:`gper.training.episodes_kernel`) instead of some fifteen torch
ops; it writes the same running sums, rows and count, and leaves the ring's spare row alone.
"""

from __future__ import annotations

import numpy as np
import torch

from gper.training.episodes_kernel import record_step


class EpisodeTracker:
    """Device-side record of finished episodes for ``num_envs`` environments.

    Args:
        num_envs: environments stepped together.
        device: where the tensors live.
        ring: finished episodes kept between two drains; more than that in one epoch and the
            oldest are lost (:meth:`drain` says how many).
        autoreset: the environment's :attr:`~gper.envs.base.VecEnv.autoreset`, ``"same-step"``
            or ``"next-step"`` (see the module docstring).
        agents: the agents of a population sharing the tracker (see the module docstring); a
            population's ring holds ``ring`` episodes per agent.
        kernels: ``"torch"`` (default) or ``"triton"``: a step's record as torch ops or as one
            Triton kernel (on CUDA, or on the CPU under ``TRITON_INTERPRET=1``).
    """

    def __init__(
        self,
        num_envs: int,
        device: torch.device,
        ring: int = 8192,
        autoreset: str = "same-step",
        agents: int = 1,
        kernels: str = "torch",
    ) -> None:
        if autoreset not in ("same-step", "next-step"):
            raise ValueError(f"autoreset must be 'same-step' or 'next-step', got {autoreset!r}")
        if kernels not in ("torch", "triton"):
            raise ValueError(f"kernels must be 'torch' or 'triton', got {kernels!r}")
        self.kernels = kernels
        if not isinstance(agents, int) or agents < 1 or num_envs % agents:
            raise ValueError(f"agents must be an integer >= 1 that divides num_envs {num_envs}, got {agents!r}")
        self.num_envs, self.agents = num_envs, agents
        # per agent: N agents finish about N times the episodes of one in an epoch
        self.ring = max(int(ring) * agents, num_envs)
        self.autoreset = autoreset
        self.returns = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.float64, device=device)
        # next-step autoreset: the copies whose last step ended an episode, so this step is a reset step
        self.resetting = torch.zeros(num_envs, dtype=torch.bool, device=device)
        # rows: return, length, env step at the episode's end (and a population's agent); row ``ring``
        # is the spare. One agent keeps its 3 columns: checkpoints written before populations load
        self.table = torch.zeros(self.ring + 1, 3 if agents == 1 else 4, dtype=torch.float64, device=device)
        # the agent of each environment, as the table's fourth column (a population's only)
        block = num_envs // agents
        self._agent = (torch.arange(num_envs, device=device) // block).to(torch.float64) if agents > 1 else None
        self.count = torch.zeros((), dtype=torch.int64, device=device)
        self._read = 0

    def record(self, reward: torch.Tensor, done: torch.Tensor, env_step: torch.Tensor) -> None:
        """Add one step's rewards (float32 or float64 ``[N]``, summed in float64); write the episodes
        that ``done`` (bool ``[N]``) ends, at ``env_step`` (a 0-d float64 tensor). Device work only,
        the same kernels every step."""
        if self.kernels == "triton":
            record_step(
                reward, done, env_step, self.returns, self.lengths, self.resetting, self.table, self.count,
                per_agent=self.num_envs // self.agents, next_step=self.autoreset == "next-step",
            )  # fmt: skip
            return
        reward = reward.to(torch.float64)
        if self.autoreset == "next-step":
            # a reset step adds nothing to the episode it starts (and ends none)
            live = ~self.resetting
            reward = torch.where(live, reward, 0.0)
            done = done & live
            self.resetting.copy_(done)
            self.lengths += live
        else:
            self.lengths += 1
        self.returns += reward
        ended = done.to(torch.int64)
        slot = torch.where(done, (self.count + ended.cumsum(0) - 1) % self.ring, self.ring)
        columns = [self.returns, self.lengths, env_step.expand_as(self.returns)]
        rows = torch.stack(columns if self._agent is None else [*columns, self._agent], dim=1)
        self.table.index_copy_(0, slot, rows)
        self.count += ended.sum()
        keep = (~done).to(self.returns.dtype)
        self.returns *= keep
        self.lengths *= keep

    def snapshot(self) -> dict[str, torch.Tensor]:
        """The tensors to copy to the host (see :class:`gper.training.readback.AsyncReadback`)."""
        return {"episodes": self.table, "episode_count": self.count}

    def drain(self, host: dict[str, torch.Tensor]) -> tuple[list[tuple[float, int, int]], int]:
        """Episodes finished since the last drain, oldest first, from a host copy of :meth:`snapshot`,
        as (return, length, env step at its end); and how many were lost because more than
        ``ring`` finished in between. A population's: all its agents' episodes together (see
        :meth:`drain_agents`)."""
        rows, lost = self._drain_rows(host)
        return episode_tuples(rows), lost

    def drain_agents(self, host: dict[str, torch.Tensor]) -> tuple[list[list[tuple[float, int, int]]], int]:
        """Like :meth:`drain`, the episodes sorted by agent: list ``i`` holds agent ``i``'s (return,
        length, env step), oldest first; one list for a single agent. Either drain reads the
        episodes once: call one of them an epoch (see also :meth:`drain_rows`)."""
        rows, lost = self._drain_rows(host)
        if self.agents == 1:
            return [episode_tuples(rows)], lost
        return [episode_tuples(own) for own in split_by_agent(rows, self.agents)], lost

    def drain_rows(self, host: dict[str, torch.Tensor]) -> tuple[np.ndarray, int]:
        """Like :meth:`drain`, as one float64 array of rows (return, length, env step at its end,
        and for a population the agent), oldest first (the order the ring recorded them: a step's
        environments in order); and how many were lost. Any drain reads the episodes once."""
        return self._drain_rows(host)

    def _drain_rows(self, host: dict[str, torch.Tensor]) -> tuple[np.ndarray, int]:
        # the new rows in one gather of the host copy (a population finishes thousands an epoch)
        count = int(host["episode_count"])
        new = count - self._read
        lost = max(0, new - self.ring)
        first = count - min(new, self.ring)
        table = host["episodes"].cpu().numpy()
        rows = table[np.arange(first, count) % self.ring]
        self._read = count
        return rows, lost

    def restart(self) -> None:
        """Drop the episodes in flight: the environment was reset (their steps so far count nowhere)."""
        self.returns.zero_()
        self.lengths.zero_()
        self.resetting.zero_()

    def state_dict(self) -> dict[str, object]:
        """The running sums, the ring (episodes not drained yet included), the counts and, for a
        next-step environment, which copies take a reset step next."""
        return {
            "returns": self.returns,
            "lengths": self.lengths,
            "table": self.table,
            "count": self.count,
            "read": self._read,
            "resetting": self.resetting,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.returns.copy_(state["returns"])
        self.lengths.copy_(state["lengths"])
        self.table.copy_(state["table"])
        self.count.copy_(state["count"])
        self._read = int(state["read"])
        # a state saved before the tracker knew reset steps had none pending
        self.resetting.copy_(state.get("resetting", torch.zeros_like(self.resetting)))


def split_by_agent(rows: np.ndarray, agents: int) -> list[np.ndarray]:
    """A population's drained rows (:meth:`EpisodeTracker.drain_rows`) by agent: entry ``i`` holds
    agent ``i``'s, oldest first."""
    agent = rows[:, 3].astype(np.int64)
    order = np.argsort(agent, kind="stable")
    bounds = np.searchsorted(agent[order], np.arange(agents + 1))
    rows = rows[order]
    return [rows[bounds[i] : bounds[i + 1]] for i in range(agents)]


def episode_tuples(rows: np.ndarray) -> list[tuple[float, int, int]]:
    """(return, length, env step) of each ring row (lengths and steps are whole numbers held as floats)."""
    ints = rows[:, 1:3].astype(np.int64)
    return list(zip(rows[:, 0].tolist(), ints[:, 0].tolist(), ints[:, 1].tolist(), strict=True))

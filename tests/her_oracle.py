"""A plain-Python oracle of hindsight relabelling in gper's trajectory buffer, and the goal-conditioned
streams it is fed: lists and numpy scalars, nothing vectorised.

:class:`GoalStreams` makes what a vectorized goal-conditioned environment hands to ``add``: an
``obs``, an ``achieved_goal`` (a function of the observation) and a ``desired_goal`` (one per
episode), in both of Gymnasium's autoreset styles, with unflagged resets mid-episode and right
after a next-step reset step (an end row that ends no step), and episodes longer than the ring.
Every observation is new (``obs`` carries a running count), so with ``goal_values=None`` every
row's achieved goal is unique and a relabelled goal names the row it came from; with a small
``goal_values`` achieved goals repeat, as a bit-flipping task's do, and reach desired goals.

:class:`HerOracle` reads the streams as ``docs/trajectory.md`` says ``add`` does (*How add reads
the episode structure*, ``autoreset="auto"``) and states what a draw may hold
(*Hindsight relabelling*): which rows a relabelled goal may come from, and the transition
(n-step return, next observation, flags, discount) for a goal, from ``reward_fn`` and
``terminated_fn`` called on one step at a time.

Never edit this file to make a test pass: a disagreement is a bug in gper or in the test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

STEP, END = 0, 1
OBS_KEYS = ("obs", "achieved_goal", "desired_goal")
SPEC = {
    "obs": ((2,), torch.float32),
    "achieved_goal": ((2,), torch.float32),
    "desired_goal": ((2,), torch.float32),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
}


def reward_fn(achieved: torch.Tensor, desired: torch.Tensor, info: dict) -> torch.Tensor:
    """-1 until the goal is reached, and a small term of the action (so ``info`` is read)."""
    return -(achieved != desired).any(-1).float() + 0.125 * (info["action"] % 3).float()


def terminated_fn(achieved: torch.Tensor, desired: torch.Tensor, info: dict) -> torch.Tensor:
    return (achieved == desired).all(-1)


def f32(x) -> np.float32:
    return np.float32(x)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------------------------ streams


@dataclass
class _Env:
    style: str
    obs: dict[str, np.ndarray]
    length: int
    t: int = 0
    reset_due: bool = False  # next-step style: the next add is the reset step
    after_reset_step: bool = False


class GoalStreams:
    """``num_envs`` random goal-conditioned streams; :meth:`step` is one ``add``'s data (numpy).

    Attributes:
        zero_step_ends: unflagged resets right after a reset step made so far (end rows ending no step).
    """

    def __init__(
        self,
        num_envs: int,
        seed: int = 0,
        goal_values: int | None = None,
        long_length: int = 40,
        p_jump: float = 0.03,
        p_zero_step: float = 0.3,
        styles: tuple[str, ...] = ("next", "same"),
        lengths: tuple[int, int] | None = None,
    ):
        self.rng = np.random.default_rng(seed)
        self.num_envs, self.goal_values, self.long_length = num_envs, goal_values, long_length
        self.p_jump, self.p_zero_step = p_jump, p_zero_step
        self.lengths = lengths  # every episode's length in [lo, hi] (default: a mix, some longer than a ring)
        self.count = 0
        self.zero_step_ends = 0
        self.envs = [
            _Env(str(self.rng.choice(list(styles))), self._new_obs(e, self._goal(e)), self._length())
            for e in range(num_envs)
        ]

    def _length(self) -> int:
        if self.lengths is not None:
            return int(self.rng.integers(self.lengths[0], self.lengths[1] + 1))
        u = self.rng.random()
        if u < 0.25:
            return 1
        if u < 0.8:
            return int(self.rng.integers(2, 10))
        return int(self.rng.integers(self.long_length // 3, self.long_length + 1))

    def _goal(self, e: int) -> np.ndarray:
        if self.goal_values is None:  # never an achieved goal: only relabelling reaches it
            return np.array([-1.0 - e, self.rng.integers(0, 1000)], dtype=np.float32)
        return np.array([self.rng.integers(0, self.goal_values), 0.0], dtype=np.float32)

    def _new_obs(self, e: int, goal: np.ndarray) -> dict[str, np.ndarray]:
        self.count += 1
        obs = np.array([e, self.count], dtype=np.float32)
        if self.goal_values is None:
            ag = obs.copy()
        else:
            ag = np.array([(self.count * 7919) % self.goal_values, 0.0], dtype=np.float32)
        return {"obs": obs, "achieved_goal": ag, "desired_goal": goal.copy()}

    def step(self) -> dict[str, np.ndarray]:
        e_n = self.num_envs
        out = {k: np.zeros((e_n, 2), np.float32) for k in OBS_KEYS}
        out |= {"next_" + k: np.zeros((e_n, 2), np.float32) for k in OBS_KEYS}
        out |= {
            "action": self.rng.integers(-50, 50, e_n).astype(np.int64),
            "reward": self.rng.standard_normal(e_n).astype(np.float32),
            "terminated": np.zeros(e_n, bool),
            "truncated": np.zeros(e_n, bool),
        }
        for e, env in enumerate(self.envs):
            if env.after_reset_step and self.rng.random() < self.p_zero_step:
                env.obs = self._new_obs(e, self._goal(e))  # a reset the flags do not report
                self.zero_step_ends += 1
            elif not env.reset_due and env.t > 0 and self.rng.random() < self.p_jump:
                env.obs = self._new_obs(e, self._goal(e))
                env.t, env.length = 0, self._length()
            env.after_reset_step = False
            for k in OBS_KEYS:
                out[k][e] = env.obs[k]
            if env.reset_due:  # next-step autoreset: the final observation again, then the reset one
                env.obs = self._new_obs(e, self._goal(e))
                for k in OBS_KEYS:
                    out["next_" + k][e] = env.obs[k]
                env.reset_due, env.after_reset_step = False, True
                env.t, env.length = 0, self._length()
                continue
            nxt = self._new_obs(e, env.obs["desired_goal"])
            for k in OBS_KEYS:
                out["next_" + k][e] = nxt[k]
            env.t += 1
            if env.t < env.length:
                env.obs = nxt
                continue
            u = self.rng.random()
            out["terminated"][e], out["truncated"][e] = u < 0.6, u >= 0.5
            if env.style == "next":
                env.obs, env.reset_due = nxt, True
            else:
                env.obs = self._new_obs(e, self._goal(e))
                env.t, env.length = 0, self._length()
        return out


# ------------------------------------------------------------------------------------------ oracle


@dataclass
class Row:
    kind: int
    values: dict[str, np.ndarray]
    terminated: bool = False
    truncated: bool = False


@dataclass
class Stream:
    rows: list[Row] = field(default_factory=list)
    pending: dict[str, np.ndarray] | None = None
    ended: bool = False


class HerOracle:
    """The rows of every stream as ``add`` reads them, and what a draw of each may hold."""

    def __init__(self, num_envs: int, rows_per_env: int, window: int):
        self.T, self.window = rows_per_env, window
        self.streams = [Stream() for _ in range(num_envs)]

    def add(self, data: dict[str, np.ndarray]) -> None:
        for e, s in enumerate(self.streams):
            step = {k: np.array(data[k][e]) for k in SPEC}
            nxt = {k: np.array(data["next_" + k][e]) for k in OBS_KEYS}
            term, trunc = bool(data["terminated"][e]), bool(data["truncated"][e])
            if s.pending is None:
                s.rows.append(Row(STEP, step, term, trunc))
            else:
                same = all(same_bits(step[k], s.pending[k]) for k in OBS_KEYS)
                if s.ended and same:  # the reset step: an end row holding its observation
                    s.rows.append(Row(END, {k: step[k] for k in OBS_KEYS}))
                elif s.ended or not same:
                    if not s.ended and s.rows[-1].kind == STEP:
                        s.rows[-1].truncated = True  # an unflagged reset
                    s.rows.append(Row(END, dict(s.pending)))
                    s.rows.append(Row(STEP, step, term, trunc))
                else:
                    s.rows.append(Row(STEP, step, term, trunc))
            s.pending, s.ended = nxt, term or trunc

    # ---------------------------------------------------------------- queries

    def where(self, slot: int) -> tuple[int, int]:
        """(stream, row number) held in ``slot``."""
        e, pos = divmod(slot, self.T)
        count = len(self.streams[e].rows)
        assert pos < count, f"slot {slot} was never written"
        return e, pos + (count - 1 - pos) // self.T * self.T

    def zero_step_end_rows(self) -> int:
        """End rows that end no step (the row before is an end row), among all rows ever written."""
        pairs = (pair for s in self.streams for pair in zip(s.rows, s.rows[1:], strict=False))
        return sum(1 for a, b in pairs if a.kind == END and b.kind == END)

    def episode(self, e: int, k: int) -> tuple[int, int, int]:
        """(first row still stored, last row, oldest stored row) of row ``k``'s episode: the last row
        is its end row, or the newest row while it is in progress."""
        rows = self.streams[e].rows
        first = next((j + 1 for j in range(k - 1, -1, -1) if rows[j].kind == END), 0)
        last = next((j for j in range(k + 1, len(rows)) if rows[j].kind == END), len(rows) - 1)
        oldest = max(0, len(rows) - self.T)
        return max(first, oldest), last, oldest

    def goal_rows(self, slot: int, strategy: str) -> list[int]:
        """The rows a relabelled goal of the start in ``slot`` may come from."""
        e, k = self.where(slot)
        rows = self.streams[e].rows
        assert rows[k].kind == STEP, f"slot {slot} holds an end row"
        first, last, _ = self.episode(e, k)
        return {"future": list(range(k + 1, last + 1)), "final": [last], "episode": list(range(first, last + 1))}[
            strategy
        ]

    def achieved(self, slot: int, q: int) -> np.ndarray:
        e, _ = self.where(slot)
        return self.streams[e].rows[q].values["achieved_goal"]

    def transition(
        self, slot: int, n: int, gamma: float, goal: np.ndarray | None = None, rf=None, tf=None
    ) -> dict[str, np.ndarray]:
        """What ``sample(n_step=n, gamma=gamma)`` holds for the start in ``slot``: the stored
        transition (``goal`` None), or the one relabelled to ``goal`` with ``rf`` / ``tf``."""
        e, k = self.where(slot)
        rows = self.streams[e].rows
        g = f32(gamma)
        acc, gi, m = None, f32(1.0), 0
        hit = False
        for i in range(n):
            step = rows[k + i]
            assert step.kind == STEP
            if goal is None:
                r = f32(step.values["reward"])
            else:
                ag = torch.from_numpy(rows[k + i + 1].values["achieved_goal"][None].copy())
                dg = torch.from_numpy(goal[None].copy())
                info = {"action": torch.tensor([int(step.values["action"])])}
                r = f32(rf(ag, dg, info)[0].item())
                hit = bool(tf(ag, dg, info)[0]) if tf is not None else False
            term = f32(gi * r)
            acc = term if acc is None else f32(acc + term)
            gi = f32(gi * g)
            m = i + 1
            if step.terminated or step.truncated or hit:
                break
        last = rows[k + m - 1]
        out = {name: v.copy() for name, v in rows[k].values.items()}
        out["reward"] = np.array(acc, dtype=np.float32)
        for key in OBS_KEYS:
            out["next_" + key] = rows[k + m].values[key].copy()
        if goal is not None and tf is not None:
            terminated = hit
            truncated = last.truncated or (last.terminated and not hit)
        else:
            terminated, truncated = last.terminated, last.truncated
        if goal is not None:
            out["desired_goal"] = goal.copy()
            out["next_desired_goal"] = goal.copy()
        out["terminated"] = np.array(terminated)
        out["truncated"] = np.array(truncated)
        out["discount"] = np.array(f32(0.0) if terminated else gi, dtype=np.float32)
        return out

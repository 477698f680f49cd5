"""Hindsight experience replay on the device: goals relabelled at sample time, inside the sample step.

Andrychowicz et al. 2017, "Hindsight Experience Replay" (arXiv:1707.01495): a transition of a
goal-conditioned task is replayed with a goal that was achieved later in its episode, so a
failed episode still teaches how to reach the states it did reach. :class:`HindsightRelabeling`
holds the settings (strategy, ratio, the goal fields, the reward function); :class:`Relabeler`
applies them to a drawn batch of a :class:`~gper.TrajectoryReplayBuffer`, in torch operations on
``B`` (times ``n_step``) rows: no host reads, so it is captured in the buffer's sample graph.

The goal of a relabelled draw comes from a row of the start's episode (:mod:`gper.replay.episodes`
keeps the episode bounds), chosen with Philox words (:func:`gper.ops.philox.randint4x`) on a
device counter of the buffer's, so draws are the same for the same seed and history on every
back end. ``docs/trajectory.md`` (*Hindsight relabelling*) says what a relabelled draw holds,
and why its priority and IS weight are the start's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

import torch

from gper.ops.her.reference import STRATEGY
from gper.replay.checks import check_unit
from gper.replay.episodes import EpisodeIndex
from gper.replay.storage import Field
from gper.replay.streams import StreamLayout

#: where a relabelled goal comes from, for a start at row k of an episode
STRATEGIES = ("future", "final", "episode", "none")
#: the relabelling's Philox key is the buffer's seed xor this: its words never repeat the tree's
_KEY = 0x4845522D474F414C  # "HER-GOAL"
#: the steps' fields a reward or termination function may read besides the spec's
STEP_FLAG_KEYS = ("terminated", "truncated")

GoalFn = Callable[[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class HindsightRelabeling:
    """How a :class:`~gper.TrajectoryReplayBuffer` relabels goals when it samples (``her=...``).

    The goal fields are observation fields of the buffer (``obs_keys=("obs", "achieved_goal",
    "desired_goal")``): each row stores them once, and an episode's end row stores the final ones.

    Args:
        reward_fn: ``reward_fn(achieved_goal, desired_goal, info) -> reward``: torch operations on
            ``[N, *goal_shape]`` goals and ``info`` (``{key: [N, *shape]}`` of ``info_keys``)
            giving ``[N]`` rewards (cast to float32), on the buffer's device. It runs inside the
            sample (and its CUDA graph): no host reads, no data-dependent shapes. A step's reward
            reads the achieved goal of the row after it (the next observation's).
        strategy: "future" (a row after the start, up to the episode's final observation),
            "final" (the final observation; the newest row while the episode is in progress),
            "episode" (any row of the episode still stored, the start and the final one included)
            or "none" (never relabel: the same buffer and checkpoints, for ablations).
        relabel_ratio: the chance in [0, 1] that a draw is relabelled; the others keep their goal.
            The paper's ``k`` relabelled goals per real one is ``k / (k + 1)`` (:meth:`with_k`).
        achieved_goal, desired_goal: the names of the goal fields (same shape and dtype).
        info_keys: fields of the step passed to ``reward_fn`` in ``info`` (the spec's, e.g. the
            action, and the stored ``terminated`` / ``truncated``).
        terminated_fn: ``terminated_fn(achieved_goal, desired_goal, info) -> [N] bool``, or None
            to keep the stored flags. Given, a relabelled return stops at the first step that
            reaches the new goal (terminated there: discount 0), and a stored end that it does not
            confirm reads as a truncation (the return still stops there; it bootstraps).

    A buffer pickles with its settings: give it module-level functions (not lambdas) to pickle it;
    ``copy.deepcopy`` takes either.
    """

    reward_fn: GoalFn
    strategy: str = "future"
    relabel_ratio: float = 0.8
    achieved_goal: str = "achieved_goal"
    desired_goal: str = "desired_goal"
    info_keys: tuple[str, ...] = ()
    terminated_fn: GoalFn | None = None

    def __post_init__(self) -> None:
        if not callable(self.reward_fn):
            raise TypeError(f"HindsightRelabeling: reward_fn must be callable, got {type(self.reward_fn).__name__}")
        if self.terminated_fn is not None and not callable(self.terminated_fn):
            raise TypeError(
                f"HindsightRelabeling: terminated_fn must be callable or None, got {type(self.terminated_fn).__name__}"
            )
        if self.strategy not in STRATEGIES:
            raise ValueError(f"HindsightRelabeling: strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        object.__setattr__(self, "relabel_ratio", check_unit("relabel_ratio", self.relabel_ratio))
        for name in ("achieved_goal", "desired_goal"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TypeError(f"HindsightRelabeling: {name} must be a field name, got {value!r}")
        if self.achieved_goal == self.desired_goal:
            raise ValueError(f"HindsightRelabeling: achieved_goal and desired_goal are both {self.achieved_goal!r}")
        keys = self.info_keys
        if isinstance(keys, str) or not isinstance(keys, tuple | list) or not all(isinstance(k, str) for k in keys):
            raise TypeError(f"HindsightRelabeling: info_keys must be a tuple of field names, got {keys!r}")
        if len(set(keys)) != len(keys):
            raise ValueError(f"HindsightRelabeling: info_keys has duplicates: {tuple(keys)}")
        object.__setattr__(self, "info_keys", tuple(keys))

    @classmethod
    def with_k(cls, reward_fn: GoalFn, k: int = 4, **kwargs: object) -> HindsightRelabeling:
        """The paper's ``k`` relabelled goals for each original one: ``relabel_ratio = k / (k + 1)``
        (k = 4: 0.8). ``kwargs`` are the other settings."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"HindsightRelabeling.with_k: k must be an int >= 0, got {k!r}")
        return cls(reward_fn, relabel_ratio=k / (k + 1), **kwargs)

    def check_layout(self, layout: StreamLayout) -> None:
        """Raise a one-line ValueError unless the buffer's fields fit these settings."""
        spec = layout.spec()
        for name in (self.achieved_goal, self.desired_goal):
            if name not in layout.obs_keys:
                where = "is not in the spec" if name not in spec else "is in the spec but not in obs_keys"
                raise ValueError(
                    f"her: the goal field {name!r} {where}: goals are observation fields, e.g. spec "
                    f"{{..., {name!r}: (shape, dtype)}} and obs_keys=('obs', {self.achieved_goal!r}, "
                    f"{self.desired_goal!r})"
                )
        a, d = spec[self.achieved_goal], spec[self.desired_goal]
        if a != d:
            raise ValueError(
                f"her: {self.achieved_goal!r} is {a[0]} {a[1]} but {self.desired_goal!r} is {d[0]} {d[1]}: "
                "the goals must have one shape and dtype"
            )
        unknown = [k for k in self.info_keys if k not in spec and k not in STEP_FLAG_KEYS]
        if unknown:
            raise ValueError(f"her: info_keys {unknown} are not fields of a step; it has {[*spec, *STEP_FLAG_KEYS]}")


class Relabeler:
    """A buffer's hindsight relabelling: its settings, its episode index and its random counter.

    Args:
        her: the settings (checked against ``layout`` here).
        layout: the buffer's rows.
        num_envs, rows_per_env: the buffer's streams.
        device: where the index and the counter live.
        kernels: the back end's relabelling kernels (:func:`gper.ops.kernels` of ``"her"``).
    """

    def __init__(
        self,
        her: HindsightRelabeling,
        layout: StreamLayout,
        num_envs: int,
        rows_per_env: int,
        device: torch.device,
        kernels: ModuleType,
    ) -> None:
        her.check_layout(layout)
        self.her, self.layout, self.rows_per_env, self.kernels = her, layout, rows_per_env, kernels
        self.index = EpisodeIndex(num_envs, rows_per_env, device)
        #: Philox blocks used so far: one per draw relabelling could apply to
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        # a draw is relabelled when a uniform 32-bit word is below this: probability threshold / 2^32
        self.threshold = round(her.relabel_ratio * 2**32)
        by_name = {f.name: f for f in layout.row.fields} | {f.name: f for f in layout.visible.fields}
        self._goal, self._desired = by_name[her.achieved_goal], by_name[her.desired_goal]
        self._info = {k: by_name[k] for k in her.info_keys}
        # the words of each field a sample gathers (only those are read)
        self._cols = {
            f.name: torch.arange(f.offset // 4, -(-(f.offset + f.nbytes) // 4), device=device, dtype=torch.int64)
            for f in (self._goal, *self._info.values())
        }

    @staticmethod
    def estimate_bytes(num_envs: int, rows_per_env: int) -> int:
        return EpisodeIndex.estimate_bytes(num_envs, rows_per_env) + 8

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.index.state_dict() | {"her_counter": self.counter}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.index.load_state_dict(state)
        self.counter.copy_(state["her_counter"])

    def checks(
        self, state: Mapping[str, torch.Tensor], flags: torch.Tensor, streams: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Named failed-checks of a state's index and counter (see :meth:`EpisodeIndex.checks`)."""
        counter = state["her_counter"].to(flags.device)
        return self.index.checks(state, flags, streams) | {"the relabelling counter is negative": (counter < 0).any()}

    def after_add(self, before: torch.Tensor, streams: torch.Tensor) -> None:
        """Index the rows an ``add`` wrote (``before``: a copy of ``streams`` from before it)."""
        self.index.after_add(self.kernels, before, streams)

    # ---------------------------------------------------------------- sample

    def _gather(self, words: torch.Tensor, slots: torch.Tensor, f: Field) -> torch.Tensor:
        """Field ``f`` of the rows at ``slots`` [N] of ``words`` [S, W] int32: ``[N, *f.shape]``."""
        got = words.view(-1)[slots[:, None] * words.shape[1] + self._cols[f.name][None, :]]
        raw = got.view(torch.uint8)
        skip = f.offset % 4
        if skip or f.nbytes % 4:  # a field that shares its first or last word with another
            raw = raw[:, skip : skip + f.nbytes].contiguous()
        return raw.view(f.dtype).reshape(slots.shape[0], *f.shape)

    def _call(self, fn: GoalFn, what: str, ag: torch.Tensor, goal: torch.Tensor, info: dict) -> torch.Tensor:
        out = fn(ag, goal, info)
        n = ag.shape[0]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (n,) or out.device != ag.device:
            got = f"{tuple(out.shape)} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"her: {what} must return a [{n}] tensor on {ag.device} (one per step), got {got}")
        return out

    def _reward_inputs(
        self, parts: dict[str, torch.Tensor], rows: torch.Tensor, goal: torch.Tensor, n_step: int
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """What ``reward_fn`` gets for the m steps of each drawn transition and its new ``goal``:
        the achieved goals, the goal repeated per step, and the info fields (all [B * n_step, ...])."""
        her, t, layout, idx = self.her, self.rows_per_env, self.layout, parts["indices"]
        b = idx.numel()
        # the m steps' rewards for the new goal: step k + i reads the achieved goal of row k + i + 1
        if n_step == 1:  # the sample gathered both rows: copies of their fields (the functions get their own)
            ag = layout.row.view(parts["next_rows"], her.achieved_goal).clone()
            info = {k: layout.visible.view(parts["rows"], k).clone() for k in self._info}
            return ag, goal.clone(), info
        pos = torch.remainder(idx, t)
        base = idx - pos
        ahead = pos[:, None] + torch.arange(n_step, device=idx.device, dtype=torch.int64)[None, :]
        after = base[:, None] + torch.remainder(ahead + 1, t)  # [B, n] the next observations' slots
        ag = self._gather(rows, after.view(-1), self._goal)
        info = {}
        if self._info:
            steps = (base[:, None] + torch.remainder(ahead, t)).view(-1)
            info = {k: self._gather(rows, steps, f) for k, f in self._info.items()}
        gshape = goal.shape[1:]
        goals = goal[:, None].expand(b, n_step, *gshape).reshape(b * n_step, *gshape)
        return ag, goals, info

    def relabel(
        self,
        parts: dict[str, torch.Tensor],
        rows: torch.Tensor,
        streams: torch.Tensor,
        n_step: int,
        gamma: torch.Tensor,
        seed: int,
    ) -> None:
        """Relabel a drawn batch in place (the sample's outputs ``parts``, as
        :class:`~gper.replay.trajectory_batch.TransitionSample` splits them).

        Args:
            parts: ``rows``, ``next_rows`` [B, W] int32, ``indices`` [B] int64, ``discount`` [B]
                float32 (patched where relabelled) and ``relabelled`` [B] bool (written).
            rows: [E * T, W] int32 the buffer's storage.
            streams: [E, 2] int64 the stream counts.
            n_step: the sample's steps (its returns were summed over ``m <= n_step`` of them).
            gamma: 0-d float32 device tensor (clamped to [0, 1], NaN read as 1, as the kernels do).
            seed: the buffer's seed.
        """
        her, t, layout = self.her, self.rows_per_env, self.layout
        idx, flag = parts["indices"], parts["relabelled"]
        if her.strategy == "none":
            flag.zero_()
            return
        b = idx.numel()
        goal_slot = torch.empty_like(idx)
        self.kernels.her_pick(
            idx=idx,
            streams=streams,
            ids=self.index.ids,
            records=self.index.records,
            counter=self.counter,
            seed=seed ^ _KEY,
            strategy=STRATEGY[her.strategy],
            threshold=self.threshold,
            rows_per_env=t,
            out_goal=goal_slot,
            out_flag=flag,
        )
        goal = self._gather(rows, goal_slot, self._goal)
        ag, goals, info = self._reward_inputs(parts, rows, goal, n_step)
        reward = self._call(her.reward_fn, "reward_fn", ag, goals, info).to(torch.float32).reshape(b, n_step)
        hit = None
        if her.terminated_fn is not None:
            hit = self._call(her.terminated_fn, "terminated_fn", ag, goals, info).to(torch.bool).reshape(b, n_step)
        self.kernels.her_finish(
            rows=rows,
            idx=idx,
            flag=flag,
            goal=goal.view(b, -1).view(torch.uint8),
            reward=reward.contiguous(),
            hit=None if hit is None else hit.contiguous(),
            gamma=gamma,
            rows_per_env=t,
            reward_col=layout.reward_col,
            flags_col=layout.flags_col,
            desired_offset=self._desired.offset,
            out_rows=parts["rows"],
            out_next=parts["next_rows"],
            out_discount=parts["discount"],
        )
        self.counter.add_(b)  # last: a function that raises leaves the counter as it was

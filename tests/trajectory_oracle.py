"""A plain-Python oracle of gper's trajectory replay: lists, numpy scalars and floats, nothing vectorised.

It states what ``docs/trajectory.md`` says :class:`gper.TrajectoryReplayBuffer` must do, in the
simplest code that says it:

* ``num_envs`` streams, each a list of every row ever written (a step, or an *end row* holding an
  episode's final observation); row ``k`` of stream ``e`` sits in slot ``e * T + k % T`` while
  ``k >= count - T``;
* ``add`` compares each stream's ``obs`` bit for bit (the bytes of the arrays) with the
  ``next_obs`` of its previous step and writes what the table of *How add reads the episode
  structure* says: the step; one end row holding ``obs``; an end row holding the pending
  observation, then the step (after an unflagged reset the step before is marked truncated);
* a step becomes a drawable start when the ``window`` rows after it are written or its episode
  ended within them, at the max priority of that moment, and stays one until its slot is
  written again (every write bumps the slot's generation);
* a start's 1-step and n-step transition and its sequences, with their mask and zeros;
* priority updates: ``(|td| + eps) ** alpha`` of a draw, the R2D2 mix of a sequence's masked
  steps, NaN/Inf to the max priority as it was before the call, stale entries (slot written
  since the draw) ignored, raw indices of slots that are not drawable starts dropped; IS weights
  ``(p_i / p_min) ** -beta`` over the drawable starts.

n-step returns are summed in numpy float32 in the order the document gives (``r_0``, then
``+ g r_1``, ...), with ``g^i`` made by repeated float32 multiplication and no fused multiply-add,
so an implementation that follows it agrees bit for bit.

Two cases the document leaves open are refused here (an assertion), and the stream generator never
makes them: a reset step that is itself flagged ended, and an unflagged reset right after an end
row (there is no step before it to mark truncated).

Never edit this file to make a test pass: a disagreement is a bug in gper or in the test.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

STEP, END = 0, 1


@dataclass
class Row:
    """One stored row.

    Attributes:
        kind: STEP or END.
        values: a step's spec fields; an end row's observation keys only (its other fields are
            never read).
        terminated, truncated: of the step taken from this row's observation (False for an end row).
        episode: the first row of the episode the row belongs to (an end row: the episode it ends).
    """

    kind: int
    values: dict[str, np.ndarray]
    terminated: bool = False
    truncated: bool = False
    episode: int = 0


@dataclass
class Stream:
    rows: list[Row] = field(default_factory=list)
    pending: dict[str, np.ndarray] | None = None  # next_obs of the last add, per observation key
    ended: bool = False  # the last add's terminated or truncated
    ep_start: int = 0


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit equality: NaN equals the same NaN, 0.0 differs from -0.0."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def f32(x) -> np.float32:
    return np.float32(x)


class TrajectoryOracle:
    """The reference semantics of ``TrajectoryReplayBuffer`` (proportional/stratified priorities).

    Args:
        capacity, num_envs, window, alpha, eps: as the buffer's.
        spec: ``{name: (shape, numpy dtype)}``: every observation key and "reward" among them.
        obs_keys: the observation fields; each ``key`` comes with ``"next_" + key`` in ``add``.

    Attributes:
        priorities: one float per slot, 0.0 where the slot is not a drawable start.
        generations: one int per slot, bumped by every row written there.
        max_priority: the priority a start becomes drawable at.
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        spec: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        window: int,
        alpha: float = 0.6,
        eps: float = 1e-6,
        obs_keys: Sequence[str] = ("obs",),
    ):
        assert capacity % num_envs == 0 and capacity // num_envs >= window + 2
        self.capacity, self.num_envs, self.window = capacity, num_envs, window
        self.T = capacity // num_envs
        self.spec = {k: (tuple(s), np.dtype(d)) for k, (s, d) in spec.items()}
        self.obs_keys = tuple(obs_keys)
        self.alpha, self.eps = alpha, eps
        self.streams = [Stream() for _ in range(num_envs)]
        self.drawable_flags = [False] * capacity
        self.priorities = [0.0] * capacity
        self.generations = [0] * capacity
        self.max_priority = 1.0
        self.adds = 0
        self.discontinuities = 0
        self.invalid_indices = 0
        self.stale_updates = 0
        self.nonfinite_td = 0

    # ------------------------------------------------------------------ add

    def slot(self, e: int, k: int) -> int:
        return e * self.T + k % self.T

    def add(self, data: Mapping[str, np.ndarray]) -> None:
        """One step of every stream: ``data[name][e]`` for each spec field, ``next_<key>``,
        ``terminated`` and ``truncated``."""
        for e, s in enumerate(self.streams):
            step = {name: np.array(data[name][e], dtype=dt).reshape(shape) for name, (shape, dt) in self.spec.items()}
            nxt = {
                k: np.array(data["next_" + k][e], dtype=self.spec[k][1]).reshape(self.spec[k][0]) for k in self.obs_keys
            }
            term, trunc = bool(data["terminated"][e]), bool(data["truncated"][e])
            if s.pending is None:  # the first add starts every stream
                self._write_step(e, step, term, trunc)
            else:
                same = all(same_bits(step[k], s.pending[k]) for k in self.obs_keys)
                if s.ended and same:
                    # next-step autoreset: obs is the final observation, the action is ignored
                    assert s.rows[-1].kind == STEP, "oracle: an episode ended with no step (reset step flagged ended?)"
                    self._write_end(e, {k: step[k] for k in self.obs_keys})
                elif s.ended:
                    self._write_end(e, s.pending)
                    self._write_step(e, step, term, trunc)
                elif same:
                    self._write_step(e, step, term, trunc)
                else:
                    # a reset the flags did not report: the step before is marked truncated
                    assert s.rows[-1].kind == STEP, "oracle: an unflagged reset right after an end row"
                    s.rows[-1].truncated = True
                    self.discontinuities += 1
                    self._write_end(e, s.pending)
                    self._write_step(e, step, term, trunc)
            s.pending = nxt
            s.ended = term or trunc
        self.adds += 1

    def _claim(self, e: int, k: int) -> None:
        """A row is written at row ``k``: its slot's old row (``k - T``) is gone, the new one not drawable."""
        i = self.slot(e, k)
        self.drawable_flags[i] = False
        self.priorities[i] = 0.0
        self.generations[i] += 1

    def _make_drawable(self, e: int, k: int) -> None:
        i = self.slot(e, k)
        if not self.drawable_flags[i]:
            self.drawable_flags[i] = True
            self.priorities[i] = self.max_priority

    def _write_step(self, e: int, values: dict, term: bool, trunc: bool) -> None:
        s = self.streams[e]
        k = len(s.rows)
        self._claim(e, k)
        s.rows.append(Row(STEP, values, term, trunc, s.ep_start))
        if k - self.window >= s.ep_start:
            self._make_drawable(e, k - self.window)

    def _write_end(self, e: int, obs: dict) -> None:
        s = self.streams[e]
        k = len(s.rows)
        self._claim(e, k)
        s.rows.append(Row(END, {key: obs[key].copy() for key in self.obs_keys}, episode=s.ep_start))
        for r in range(max(k - self.window, s.ep_start), k):
            self._make_drawable(e, r)
        s.ep_start = k + 1

    # ------------------------------------------------------------- queries

    def row_at(self, slot: int) -> tuple[int, int] | None:
        """(stream, row) stored in ``slot``, or None if nothing was written there yet."""
        e, pos = divmod(slot, self.T)
        count = len(self.streams[e].rows)
        if count <= pos:
            return None
        return e, pos + (count - 1 - pos) // self.T * self.T

    def drawable(self) -> list[bool]:
        """The drawable starts, as ``add`` maintained them."""
        return list(self.drawable_flags)

    def drawable_by_definition(self) -> list[bool]:
        """The drawable starts from their definition alone: a stored step whose ``window`` rows
        after it are written, or with an end row among them (a check of :meth:`drawable`)."""
        out = [False] * self.capacity
        for slot in range(self.capacity):
            where = self.row_at(slot)
            if where is None:
                continue
            e, k = where
            rows = self.streams[e].rows
            if rows[k].kind != STEP:
                continue
            ahead = rows[k + 1 : k + 1 + self.window]
            out[slot] = len(ahead) == self.window or any(r.kind == END for r in ahead)
        return out

    def counts(self) -> list[int]:
        return [len(s.rows) for s in self.streams]

    def _start(self, slot: int) -> tuple[list[Row], int, int]:
        """(rows, row, j) of a drawable start: ``j`` is the offset of the first end row after it
        (``inf`` if none is written within the window)."""
        assert self.drawable_flags[slot], f"slot {slot} is not a drawable start"
        e, k = self.row_at(slot)
        rows = self.streams[e].rows
        j = next((j for j in range(1, self.window + 1) if k + j < len(rows) and rows[k + j].kind == END), math.inf)
        return rows, k, j

    def transition(self, slot: int, n: int, gamma: float | None) -> dict[str, np.ndarray]:
        """What ``sample(B, n_step=n, gamma=gamma)`` returns for the start in ``slot``."""
        rows, k, j = self._start(slot)
        m = min(n, j)
        g = f32(1.0) if gamma is None else f32(gamma)
        acc, gi = None, f32(1.0)
        for i in range(m):
            # sum over i < m of g^i * r_(k+i), in float32, in that order; g^i by repeated
            # multiplication; the first partial sum is the first term itself (a reward of -0.0 stays -0.0)
            term = f32(gi * rows[k + i].values["reward"])
            acc = term if acc is None else f32(acc + term)
            gi = f32(gi * g)
        out = {name: v.copy() for name, v in rows[k].values.items()}
        out["reward"] = np.array(acc, dtype=np.float32)
        for key in self.obs_keys:
            out["next_" + key] = rows[k + m].values[key].copy()
        terminated = any(rows[k + i].terminated for i in range(m))
        out["terminated"] = np.array(terminated)
        out["truncated"] = np.array(any(rows[k + i].truncated for i in range(m)))
        out["discount"] = np.array(f32(0.0) if terminated else gi, dtype=np.float32)
        return out

    def sequence(self, slot: int, length: int, burn_in: int = 0) -> dict[str, list[np.ndarray]]:
        """What ``sample_sequences(B, length, burn_in)`` returns for the start in ``slot``: per
        field a list of ``burn_in + length`` arrays, and ``mask``."""
        rows, k, j = self._start(slot)
        e, _ = self.row_at(slot)
        oldest = len(rows) - self.T  # rows before it were overwritten
        episode = rows[k].episode
        names = list(self.spec) + ["next_" + key for key in self.obs_keys] + ["terminated", "truncated"]
        out: dict[str, list] = {name: [] for name in names}
        out["mask"] = []
        masks = []
        for p in range(burn_in + length):
            r = k - burn_in + p
            if p < burn_in:
                masks.append(r >= max(0, oldest) and rows[r].episode == episode and rows[r].kind == STEP)
            else:
                masks.append(p - burn_in < j)
        # obs and next_obs are views of one gathered array (next_obs of step p is obs of step
        # p + 1): a masked-out step's observation shows when it is the next one of a masked step
        for p, mask in enumerate(masks):
            r = k - burn_in + p
            out["mask"].append(np.array(mask))
            for name in names:
                if mask:
                    kept = True
                elif name in self.obs_keys:
                    kept = p >= 1 and masks[p - 1]
                elif name.startswith("next_") and name[5:] in self.obs_keys:
                    kept = p + 1 < len(masks) and masks[p + 1]
                else:
                    kept = False
                out[name].append(self._value(rows, r, name) if kept else self._zero(name))
        return out

    def _value(self, rows: list[Row], r: int, name: str) -> np.ndarray:
        if name == "terminated":
            return np.array(rows[r].terminated)
        if name == "truncated":
            return np.array(rows[r].truncated)
        if name.startswith("next_") and name[5:] in self.obs_keys:
            return rows[r + 1].values[name[5:]].copy()
        return rows[r].values[name].copy()

    def _zero(self, name: str) -> np.ndarray:
        if name in ("terminated", "truncated"):
            return np.array(False)
        shape, dt = self.spec[name[5:] if name.startswith("next_") and name[5:] in self.obs_keys else name]
        return np.zeros(shape, dtype=dt)

    # ------------------------------------------------------ priorities

    def weights(self, indices: Sequence[int], beta: float) -> list[float]:
        """Global IS weights ``(p_i / p_min) ** -beta``, ``p_min`` over the drawable starts."""
        p_min = min(p for p, d in zip(self.priorities, self.drawable_flags, strict=True) if d)
        return [(self.priorities[i] / p_min) ** -beta for i in indices]

    def probabilities(self) -> list[float]:
        """Exact sampling probability of every slot (0 where not a drawable start)."""
        total = math.fsum(self.priorities)
        return [p / total for p in self.priorities]

    def priority(self, td: float) -> float:
        return (abs(td) + self.eps) ** self.alpha

    def sequence_priority(self, td: Sequence[float], mask: Sequence[bool], eta: float) -> float | None:
        """R2D2's ``eta * max|td| + (1 - eta) * mean|td|`` over the masked steps, then ``(. + eps) ** alpha``;
        None where a masked td is not finite."""
        steps = [abs(float(x)) for x, m in zip(td, mask, strict=True) if m]
        assert steps, "a start's own step is always masked"
        if not all(math.isfinite(x) for x in steps):
            return None
        mix = eta * max(steps) + (1 - eta) * math.fsum(steps) / len(steps)
        return (mix + self.eps) ** self.alpha

    def update(self, indices: Sequence[int], values: Sequence[float | None], generations: Sequence[int] | None) -> None:
        """Apply one ``update_priorities`` call, given each entry's new priority (None: the td was
        not finite). ``generations``: those of the batch (stale entries ignored), or None for raw
        indices (entries whose slot is not a drawable start are dropped)."""
        old_max = self.max_priority
        winner = {}
        for n, (i, p) in enumerate(zip(indices, values, strict=True)):
            if generations is not None and generations[n] != self.generations[i]:
                self.stale_updates += 1
                continue
            if not self.drawable_flags[i]:
                assert generations is None, "a batch entry of the current generation is always drawable"
                self.invalid_indices += 1
                continue
            if p is None:
                p = old_max
                self.nonfinite_td += 1
            winner[i] = p
        for i, p in winner.items():
            self.priorities[i] = p
            self.max_priority = max(self.max_priority, p)

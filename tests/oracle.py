"""A plain-Python oracle of gper's replay semantics: loops, lists and floats, nothing vectorised.

It states what the buffer must do, in the simplest code that says it (PER: Schaul et al. 2016,
arXiv:1511.05952; the rules beyond the paper are those of ``docs/design.md``, *Updates* and *Sampling*):

* a ring of ``capacity`` slots; ``add`` of ``n`` items writes the last ``min(n, capacity)`` of
  them at ``cursor + skip + k`` (mod capacity), each at the running max priority (1.0 at first),
  bumps the generation of every slot written, and advances the cursor by ``n``;
* ``update`` turns a TD error into ``(|td| + eps) ** alpha``; NaN and +-Inf become the max
  priority as it was before the call; entries outside ``[0, size)`` are dropped, entries whose
  slot generation changed since sampling are ignored; for a slot named twice the last valid
  entry wins; the max priority grows to the largest priority stored (the winning entries);
* slot ``i`` is drawn with probability ``p_i / sum(p)``; its IS weight is
  ``(N P(i)) ** -beta / max_j (N P(j)) ** -beta = (p_i / p_min) ** -beta`` over the filled slots
  (global normalisation), or ``w_i / max(w)`` over the batch;
* the K-ary tree of :class:`gper.ops.layout.TreeLayout`: each inner node is the sum (min tree:
  the min) of its ``K`` children; padding holds 0 in the sum tree and +inf in the min tree.

Never edit this file to make a test pass: a disagreement is a bug in gper or in the test.
"""

from __future__ import annotations

import math


class OracleBuffer:
    """The reference semantics of ``PrioritizedReplayBuffer``'s bookkeeping (not its storage).

    Attributes:
        priorities: one float per slot; 0.0 for a slot never written.
        generations: one int per slot, bumped by every write.
        max_priority: priority of the next item added.
    """

    def __init__(self, capacity: int, alpha: float, eps: float):
        self.capacity = capacity
        self.alpha = alpha
        self.eps = eps
        self.size = 0
        self.cursor = 0
        self.priorities = [0.0] * capacity
        self.generations = [0] * capacity
        self.max_priority = 1.0
        self.invalid_indices = 0
        self.stale_updates = 0
        self.nonfinite_td = 0

    def add(self, n: int) -> list[int]:
        """Add ``n`` items; returns the slots written, in item order."""
        kept = min(n, self.capacity)
        skip = n - kept
        slots = []
        for k in range(kept):
            slot = (self.cursor + skip + k) % self.capacity
            self.priorities[slot] = self.max_priority
            self.generations[slot] += 1
            slots.append(slot)
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return slots

    def priority(self, td: float) -> float:
        return (abs(td) + self.eps) ** self.alpha

    def update(self, indices: list[int], td_errors: list[float], generations: list[int] | None = None) -> None:
        """Apply one ``update_priorities`` call (``generations``: those seen at sampling, or None)."""
        old_max = self.max_priority
        winner = {}
        for k in range(len(indices)):
            i, td = indices[k], td_errors[k]
            if not 0 <= i < self.size:
                self.invalid_indices += 1
                continue
            if generations is not None and generations[k] != self.generations[i]:
                self.stale_updates += 1
                continue
            if math.isfinite(td):
                p = self.priority(td)
            else:
                p = old_max
                self.nonfinite_td += 1
            winner[i] = p
        for i, p in winner.items():
            self.priorities[i] = p
            self.max_priority = max(self.max_priority, p)

    def probabilities(self) -> list[float]:
        """Exact sampling probability of every slot."""
        return probabilities(self.priorities)

    def weights(self, indices: list[int], beta: float, norm: str = "global") -> list[float]:
        """IS weights of the drawn ``indices``."""
        return is_weights(self.priorities[: self.size], indices, beta, norm)


def probabilities(priorities: list[float]) -> list[float]:
    total = math.fsum(priorities)
    return [p / total for p in priorities]


def is_weights(filled: list[float], indices: list[int], beta: float, norm: str = "global") -> list[float]:
    """``(N P(i)) ** -beta`` normalised by its largest value over the filled slots ("global") or the batch.

    ``N P(i) = N p_i / sum(p)``; the largest weight belongs to the smallest priority, so the global
    normalisation is ``(p_i / p_min) ** -beta``. Written out in full here, not simplified.
    """
    n, total = len(filled), math.fsum(filled)
    w = [(n * filled[i] / total) ** -beta for i in indices]
    if norm == "global":
        top = max((n * p / total) ** -beta for p in filled)
    else:
        top = max(w)
    return [x / top for x in w]


def cumulative(priorities: list[float]) -> list[float]:
    """``c[i] = sum(priorities[:i])`` for i in 0..len (exact sums, correctly rounded)."""
    return [math.fsum(priorities[:i]) for i in range(len(priorities) + 1)]


def rank_weights(keys: list[float], alpha: float) -> list[float]:
    """Rank-based priorities: the slot with the ``r``-th largest key (1-based, ties by slot) gets ``r ** -alpha``."""
    order = sorted(range(len(keys)), key=lambda i: (-keys[i], i))
    out = [0.0] * len(keys)
    for r, i in enumerate(order, start=1):
        out[i] = r**-alpha
    return out


def build_trees(leaves: list[float], layout) -> tuple[list[float], list[float]]:
    """The flat sum and min trees of ``layout`` over ``leaves``, padding included (``layout.numel`` entries).

    Empty slots (priority 0) are 0 in the sum tree and +inf in the min tree, as padding is.
    """
    k = layout.arity
    total = [0.0] * layout.numel
    least = [math.inf] * layout.numel
    level_sum = list(leaves)
    level_min = [p if p > 0 else math.inf for p in leaves]
    for level in range(layout.depth - 1, -1, -1):
        off = layout.offsets[level]
        assert len(level_sum) == layout.sizes[level]
        for j in range(len(level_sum)):
            total[off + j] = level_sum[j]
            least[off + j] = level_min[j]
        if level == 0:
            break
        parents = layout.sizes[level - 1]
        next_sum, next_min = [], []
        for q in range(parents):
            children = range(q * k, min((q + 1) * k, len(level_sum)))
            next_sum.append(math.fsum(level_sum[c] for c in children))
            next_min.append(min(level_min[c] for c in children))
        level_sum, level_min = next_sum, next_min
    return total, least

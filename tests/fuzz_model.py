"""A plain-Python model of a whole replay buffer, for the state-machine fuzz test (``tests/replay/test_fuzz.py``).

The priority bookkeeping is :class:`oracle.OracleBuffer`'s (never edited to make a test pass); this
module adds what a buffer holds beyond it: the stored transitions, rank mode's rank weights and
their refresh schedule (``gper/replay/samplers/rank.py``, :class:`RankKeys`), the Philox counter's
advance per sample (``docs/design.md``, *Sampling*), the sampling probabilities of each mode, and
a chi-square test of a batch of draws against them.

Lists, ints and floats only: the test turns tensors into Python values before they reach the model.
"""

from __future__ import annotations

import math

from oracle import OracleBuffer, is_weights, rank_weights

#: a transition as the model keeps it: one Python value (or nested list) per field, in spec order
Item = tuple


class ReplayModel:
    """What a ``PrioritizedReplayBuffer`` of these settings must hold and report after every call.

    In "rank" mode the bookkeeping's priorities are the sort keys ``|td| + eps`` (alpha 1, as the
    buffer's ``set_keys``), and the tree holds rank weights: 1 for an item added since the last
    refresh, ``rank ** -alpha`` (ranks by key, largest first, ties by slot) from the last refresh
    otherwise; a refresh runs after every ``rank_refresh_interval``-th ``update_priorities`` call
    and on ``refresh_ranks()``.

    Args:
        capacity, sampling, weight_norm, alpha, beta, eps, rank_refresh_interval: the buffer's settings.
        rng_blocks: Philox blocks one draw uses (``gper.ops.state.rng_blocks`` of the tree depth).
    """

    def __init__(
        self,
        capacity: int,
        sampling: str,
        weight_norm: str,
        alpha: float,
        beta: float,
        eps: float,
        rank_refresh_interval: int,
        rng_blocks: int,
    ) -> None:
        self.capacity = capacity
        self.sampling = sampling
        self.rank = sampling == "rank"
        self.book = OracleBuffer(capacity, 1.0 if self.rank else alpha, eps)
        self._alpha = alpha
        self.beta = beta
        self.weight_norm = weight_norm
        self.rank_refresh_interval = rank_refresh_interval
        self.updates_since_refresh = 0
        self.rank_leaves = [0.0] * capacity
        self.items: list[Item | None] = [None] * capacity
        self.rng_blocks = rng_blocks
        self.rng_offset = 0

    # settings the buffer lets a caller change between calls
    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._alpha = value
        if not self.rank:  # rank mode's keys ignore alpha; the next refresh reads it
            self.book.alpha = value

    @property
    def eps(self) -> float:
        return self.book.eps

    @eps.setter
    def eps(self, value: float) -> None:
        self.book.eps = value

    @property
    def size(self) -> int:
        return self.book.size

    @property
    def leaves(self) -> list[float]:
        """The tree's leaf of every slot (0 for a slot never written)."""
        return self.rank_leaves if self.rank else self.book.priorities

    def add(self, items: list[Item]) -> list[int]:
        """``add`` of ``items`` (only the last ``capacity`` are kept); the slots written, in order."""
        slots = self.book.add(len(items))
        for slot, item in zip(slots, items[len(items) - len(slots) :], strict=True):
            self.items[slot] = item
            if self.rank:
                self.rank_leaves[slot] = 1.0  # new items count as rank 1
        return slots

    def update(self, indices: list[int], td: list[float], generations: list[int] | None = None) -> None:
        """One ``update_priorities`` call (``generations``: the batch's, or None for raw indices)."""
        self.book.update(indices, td, generations)
        if self.rank:
            self.updates_since_refresh += 1
            if self.updates_since_refresh >= self.rank_refresh_interval:
                self.refresh()

    def refresh(self) -> None:
        """``refresh_ranks()``: rank weights from the keys of the filled slots."""
        self.updates_since_refresh = 0
        n = self.size
        if n:
            self.rank_leaves[:n] = rank_weights(self.book.priorities[:n], self._alpha)

    def sample(self, b: int) -> None:
        """A ``sample`` of ``b`` draws advances the Philox counter by ``b`` draws' blocks."""
        self.rng_offset += b * self.rng_blocks

    def probabilities(self) -> list[float]:
        """Probability that one draw picks each filled slot."""
        n = self.size
        if self.sampling == "uniform":
            return [1.0 / n] * n
        filled = self.leaves[:n]
        total = math.fsum(filled)
        return [p / total for p in filled]

    def weights(self, indices: list[int], beta: float) -> list[float]:
        """IS weights of the drawn ``indices`` with exponent ``beta``."""
        if self.sampling == "uniform":
            return [1.0] * len(indices)
        return is_weights(self.leaves[: self.size], indices, beta, self.weight_norm)

    def stats(self) -> dict[str, int | float]:
        """What ``stats()`` must report (floats exactly, to compare with a tolerance)."""
        b = self.book
        return {
            "size": b.size,
            "cursor": b.cursor,
            "rng_offset": self.rng_offset,
            "invalid_indices": b.invalid_indices,
            "stale_updates": b.stale_updates,
            "nonfinite_td": b.nonfinite_td,
            "max_priority": b.max_priority,
            "total_priority": math.fsum(self.leaves),
        }


def chi2_threshold(df: int, z: float = 6.5) -> float:
    """Upper quantile of chi-square with ``df`` degrees of freedom at a normal ``z`` (Wilson-Hilferty):
    z = 6.5 is a tail of about 4e-11, so a correct sampler passes for almost every seed."""
    a = 2.0 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def chi2_groups(probs: list[float], draws: int, min_expected: float = 5.0) -> list[list[int]]:
    """Slots grouped so that each group expects at least ``min_expected`` of ``draws`` draws (slots taken
    in order of probability, smallest first; a remainder joins the last group)."""
    groups: list[list[int]] = []
    group, exp = [], 0.0
    for i in sorted(range(len(probs)), key=lambda i: probs[i]):
        group.append(i)
        exp += draws * probs[i]
        if exp >= min_expected:
            groups.append(group)
            group, exp = [], 0.0
    if group:
        if groups:
            groups[-1] += group
        else:
            groups.append(group)
    return groups


def chi2(counts: list[int], probs: list[float], groups: list[list[int]]) -> tuple[float, int]:
    """Chi-square of ``counts`` against ``probs`` over ``groups`` (:func:`chi2_groups`).

    Returns:
        (statistic, degrees of freedom); inf if a group where nothing was expected was drawn.
    """
    n = sum(counts)
    stat = 0.0
    for g in groups:
        obs, exp = sum(counts[i] for i in g), n * math.fsum(probs[i] for i in g)
        if exp == 0:
            if obs:
                return math.inf, len(groups) - 1
            continue
        stat += (obs - exp) ** 2 / exp
    return stat, len(groups) - 1


def surely_rejected(true: list[float], wrong: list[float], groups: list[list[int]], draws: int) -> bool:
    """Whether a chi-square against ``wrong`` over ``groups`` of draws from ``true`` exceeds
    :func:`chi2_threshold` with certainty: its mean ``df + lam`` (``lam`` the noncentrality) is more than
    seven standard deviations ``sqrt(2 (df + 2 lam))`` above the threshold."""
    df = len(groups) - 1
    if df < 1:
        return False
    lam = 0.0
    for g in groups:
        p, q = math.fsum(true[i] for i in g), math.fsum(wrong[i] for i in g)
        lam += draws * (p - q) ** 2 / q if q > 0 else (math.inf if p > 0 else 0.0)
    return df + lam - 7 * math.sqrt(2 * (df + 2 * lam)) > chi2_threshold(df)


def total_variation(p: list[float], q: list[float]) -> float:
    return 0.5 * math.fsum(abs(a - b) for a, b in zip(p, q, strict=True))

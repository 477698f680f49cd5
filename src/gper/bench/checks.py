"""The exactness checks of ``gper bench exactness``, run on one peer's sampler at a time.

Three checks, each with priority exponent 1 so that the stored priorities are the ones given:

* **reach**: ``2^reach_log2`` slots with uniform-ish priorities (uniform in [0.5, 1.5)), and
  about one draw per slot. The fraction of slots drawn at least once is compared with what
  exact sampling gives for these priorities and this many draws: ``mean(1 - (1 - q_i)^D)`` for
  independent draws, and for stratified batches of k the same with each batch's chance of
  missing slot i given the strata it spans (:func:`hit_probability`). A sampler that descends
  with a float32 threshold cannot land on some slots once the total mass is large (about a
  quarter of them at 2^25), which shows as a coverage deficit, worst on the odd slots of the
  upper half, reported on their own.
* **tiny leaf**: 32 leaves of priority 1, one of them (17) at 1e-6. Its probability, 3.2e-8,
  is narrower than float32's resolution of the total, so a float32 threshold draws it either
  never or about twice too often; the count over many draws says which.
* **distinct**: 8 leaves with priorities 0.001 .. 10; chi-square of the counts against the
  probabilities (stratified samplers vary less than independent ones, so their chi-square is
  expected well below its degrees of freedom).

Every check stops drawing at its time budget (slow host-side samplers draw fewer), and the
expectations are computed for the draws actually made.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gper.bench.peers.base import ExactSampler

CHECKS = ("reach", "tiny", "distinct")
#: leaves of the tiny-leaf check: 32 at priority 1, leaf 17 at 1e-6 (as gper's own GPU test)
TINY_N, TINY_LEAF, TINY_P = 32, 17, 1e-6
DISTINCT = np.array([1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0])
#: |z| above Z_SUSPECT is reported as suspect, above Z_LIMIT as a deviation (in probability terms, the
#: tiny-leaf check uses the Poisson tails P_SUSPECT and P_LIMIT instead)
Z_SUSPECT, Z_LIMIT = 4.0, 6.0
P_SUSPECT, P_LIMIT = 1e-3, 1e-6
#: the name each check has in the results and the report
CHECK_NAMES = {"reach": "reach", "tiny": "tiny leaf", "distinct": "distinct"}


@dataclass
class Result:
    """One check of one peer: what was drawn, what was expected, and the verdict."""

    peer: str
    check: str
    slots: int
    draws: int = 0
    batch: int = 0
    kind: str = ""
    observed: float | None = None
    expected: float | None = None
    z: float | None = None
    extra: str = ""
    verdict: str = ""
    seconds: float = 0.0


@dataclass
class ExactConfig:
    """What ``gper bench exactness`` checks, and for how long (its flags document each field)."""

    device: torch.device
    peers: list[str]
    reach_log2: int
    reach_per_slot: float
    tiny_draws: int
    distinct_draws: int
    batch: int
    budget_s: float
    out: Path | None
    checks: tuple[str, ...] = CHECKS
    #: ``time.monotonic()`` after which no check starts (the rest is reported as not run)
    deadline: float | None = None
    command: str = ""

    def budget(self) -> float:
        """Seconds of drawing for the next check: ``budget_s``, or less when the deadline is near."""
        return max(min(self.budget_s, self.left_s()), 0.0)

    def left_s(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def to_payload(self) -> dict:
        """The settings a worker process needs, as JSON-ready values (the deadline as seconds left)."""
        keys = ("reach_log2", "reach_per_slot", "tiny_draws", "distinct_draws", "batch", "budget_s")
        payload = {k: getattr(self, k) for k in keys}
        payload |= {"device": self.device.type, "checks": list(self.checks)}
        payload["deadline_s"] = None if self.deadline is None else max(self.left_s(), 0.0)
        return payload

    @classmethod
    def from_payload(cls, payload: dict, peer: str, deadline: float | None) -> ExactConfig:
        """The config of a worker that checks ``peer``, from what :meth:`to_payload` made."""
        p = {k: v for k, v in payload.items() if k != "deadline_s"}
        device, checks = torch.device(p.pop("device")), tuple(p.pop("checks"))
        return cls(device=device, peers=[peer], out=None, checks=checks, deadline=deadline, **p)


def hit_probability(q: np.ndarray, draws: int, kind: str, k: int) -> np.ndarray:
    """P(slot drawn at least once) under exact sampling of ``draws`` in batches of ``k``.

    Independent draws: ``1 - (1 - q_i)^draws``. Stratified: each batch puts one uniform draw in
    each of k equal-mass strata; in units of a stratum, slot i spans [s, e), and a batch misses
    it with probability 1 - (e - s) if it lies in one stratum, (s - floor(s)) (1 - (e - floor(e)))
    if it straddles two, and 0 if it covers a whole one.
    """
    if kind != "stratified":
        return -np.expm1(draws * np.log1p(-q))
    c = np.concatenate([[0.0], np.cumsum(q)]) * k
    s, e = c[:-1], c[1:]
    js, je = np.floor(s), np.floor(e)
    je = np.where((e == je) & (je > js), je - 1, je)  # an end on a boundary belongs to the stratum below
    miss = np.where(js == je, 1 - (e - s), np.where(je - js == 1, (s - js) * (1 - (e - je)), 0.0))
    return -np.expm1(draws / k * np.log(np.clip(miss, 1e-300, 1.0)))


def check_reach(s: ExactSampler, peer: str, log2n: int, per_slot: float, k: int, budget_s: float) -> Result:
    n = 1 << log2n
    r = Result(peer, "reach", n, kind=s.kind)
    if s.max_slots is not None and n > s.max_slots:
        r.verdict = f"n/a: refuses more than {s.max_slots:,} slots"
        return r
    prios = np.random.default_rng(7).uniform(0.5, 1.5, n).astype(np.float32)
    t0 = time.perf_counter()
    s.load(prios)
    counts, r.draws = s.count(n, int(per_slot * n), min(k, n), budget_s)
    r.seconds, r.batch = time.perf_counter() - t0, min(k, n)
    q = prios.astype(np.float64) / prios.astype(np.float64).sum()
    hit = hit_probability(q, r.draws, s.kind, r.batch)
    got = counts > 0
    r.observed, r.expected = float(got.mean()), float(hit.mean())
    r.z = (r.observed - r.expected) / (math.sqrt(float((hit * (1 - hit)).sum())) / n)
    odd = slice(n // 2 + 1, None, 2)  # where a float32 threshold at the upper end loses every other slot
    r.extra = f"upper-half odd slots {got[odd].mean():.4f} (exact {hit[odd].mean():.4f})"
    r.verdict = _verdict(r.z, r.observed < r.expected, "slots missed", "too even")
    return r


def check_tiny(s: ExactSampler, peer: str, draws: int, k: int, budget_s: float) -> Result:
    prios = np.ones(TINY_N)
    prios[TINY_LEAF] = TINY_P
    r = Result(peer, "tiny leaf", TINY_N, kind=s.kind, batch=k)
    t0 = time.perf_counter()
    s.load(prios)
    counts, r.draws = s.count(TINY_N, draws, k, budget_s)
    r.seconds = time.perf_counter() - t0
    q = TINY_P / prios.sum()
    r.observed, r.expected = float(counts[TINY_LEAF]), r.draws * q
    r.z = (r.observed - r.expected) / math.sqrt(r.expected)
    tail = _poisson_tail(int(r.observed), r.expected)
    r.extra = f"ratio {r.observed / r.expected:.2f}, Poisson tail {tail:.2g} (leaf probability {q:.3g})"
    low = r.observed < r.expected
    if r.expected < 5:
        r.verdict = f"too few draws ({r.expected:.1f} expected)"
    elif tail < P_LIMIT:
        r.verdict = ("never drawn" if r.observed == 0 else "drawn too rarely") if low else "drawn too often"
    elif tail < P_SUSPECT:
        r.verdict = f"suspect: drawn {'too rarely' if low else 'too often'}?"
    else:
        r.verdict = "ok"
    return r


def check_distinct(s: ExactSampler, peer: str, draws: int, k: int, budget_s: float) -> Result:
    r = Result(peer, "distinct", len(DISTINCT), kind=s.kind, batch=k)
    t0 = time.perf_counter()
    s.load(DISTINCT)
    counts, r.draws = s.count(len(DISTINCT), draws, k, budget_s)
    r.seconds = time.perf_counter() - t0
    expected = r.draws * DISTINCT / DISTINCT.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    df = len(DISTINCT) - 1
    r.observed, r.expected = chi2, float(df)
    p = _chi2_sf(chi2, df)
    r.z = _chi2_z(chi2, df)
    ratios = " ".join(f"{c / e:.3f}" for c, e in zip(counts, expected, strict=True))
    r.extra = f"p-value {p:.3g}; observed/expected per leaf: {ratios}"
    r.verdict = "ok" if p > 1e-6 else "frequencies off"
    return r


def _verdict(z: float, low: bool, low_text: str, high_text: str) -> str:
    if abs(z) <= Z_SUSPECT:
        return "ok"
    if abs(z) <= Z_LIMIT:
        return f"suspect: {low_text if low else high_text}?"
    return low_text if low else high_text


def _poisson_tail(k: int, lam: float) -> float:
    """P(X <= k) if k is below the mean, else P(X >= k), for X ~ Poisson(lam): how surprising k hits are.

    Summed term by term in log space, so that tails far below float64's 1 - eps keep their value.
    """
    terms = range(0, k + 1) if k < lam else range(k, k + 50 + int(20 * math.sqrt(lam) + (k - lam)))
    return min(1.0, sum(math.exp(i * math.log(lam) - lam - math.lgamma(i + 1)) for i in terms))


def _chi2_sf(x: float, df: int) -> float:
    try:
        from scipy.stats import chi2
    except ImportError:  # Wilson-Hilferty: chi2/df is close to normal after a cube root
        return 0.5 * math.erfc(_chi2_z(x, df) / math.sqrt(2))
    return float(chi2.sf(x, df))


def _chi2_z(x: float, df: int) -> float:
    """The chi-square as a standard normal score (Wilson-Hilferty): what the sd of a count-based check would be."""
    return ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


def run_checks(cfg: ExactConfig, peer: str, sampler: ExactSampler, log: Callable[[str], None]) -> list[Result]:
    """Every check for one peer; a check that fails to run is reported with its error."""
    results = []
    for check in cfg.checks:
        log(f"{peer}: {check}")
        budget = cfg.budget()
        try:
            if budget <= 0:
                raise TimeoutError("not run: past --deadline-s")
            if check == "reach":
                r = check_reach(sampler, peer, cfg.reach_log2, cfg.reach_per_slot, cfg.batch, budget)
            elif check == "tiny":
                r = check_tiny(sampler, peer, cfg.tiny_draws, cfg.batch, budget)
            else:
                r = check_distinct(sampler, peer, cfg.distinct_draws, cfg.batch, budget)
        except Exception as e:
            n = 1 << cfg.reach_log2 if check == "reach" else TINY_N if check == "tiny" else len(DISTINCT)
            text = str(e) if isinstance(e, TimeoutError) else f"error: {type(e).__name__}: {e}"
            r = Result(peer, CHECK_NAMES[check], n, verdict=text[:200])
        log(f"  {r.verdict}; {r.draws:,} draws in {r.seconds:.1f} s")
        results.append(r)
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
    return results

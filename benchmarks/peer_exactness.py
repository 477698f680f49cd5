"""Exactness of each peer's sampler: can every slot be drawn, and does each leaf come up as often as it should?

Usage::

    python benchmarks/peer_exactness.py                      # GPU if there is one (reachability at 2^25)
    python benchmarks/peer_exactness.py --device cpu         # reachability scaled down to 2^22
    python benchmarks/peer_exactness.py --peers gper cpprb --reach-log2 25 --budget-s 60

Three checks, each run on every peer's own sampler (the peers of ``bench_peers.py``, plus gper's
stratified mode and TorchRL with the float64 trees it offers; imported lazily and skipped with a
message when absent), with priority exponent 1 so that the stored priorities are the ones given:

* **reach**: ``2^--reach-log2`` slots with uniform-ish priorities (uniform in [0.5, 1.5)), and
  about one draw per slot. The fraction of slots drawn at least once is compared with what
  exact sampling gives for these priorities and this many draws: ``mean(1 - (1 - q_i)^D)`` for
  independent draws, and for stratified batches of k the same with each batch's chance of
  missing slot i given the strata it spans (:func:`_hit_probability`). A sampler
  that descends with a float32 threshold cannot land on some slots once the total mass is
  large (about a quarter of them at 2^25), which shows as a coverage deficit, worst on the odd
  slots of the upper half, reported on their own.
* **tiny leaf**: 32 leaves of priority 1, one of them (17) at 1e-6. Its probability, 3.2e-8,
  is narrower than float32's resolution of the total, so a float32 threshold draws it either
  never or about twice too often; the count over many draws says which.
* **distinct**: 8 leaves with priorities 0.001 .. 10; chi-square of the counts against the
  probabilities (stratified samplers vary less than independent ones, so their chi-square is
  expected well below its degrees of freedom).

Every check stops drawing at ``--budget-s`` seconds (slow host-side samplers draw fewer), and
the expectations are computed for the draws actually made. flashbax runs in a subprocess per
variant (float32, and float64 through ``jax_enable_x64``, a process-wide switch), on its sum
tree directly (``set_batch_bincount`` to set, ``stratified_sample`` to draw: what its buffers
call). The report goes to ``--out/peer-exactness-<device>-<stamp>.md`` and is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from bench_peers import JAX_PEERS, jax_versions, peer_status
from gper.bench.report import environment, format_markdown, header_line, print_table
from gper.bench.workload import SeedsBaseline

PEERS = ("gper", "gper-stratified", "seeds", "multinomial", "torchrl", "torchrl-fp64", "cpprb", "flashbax")
PEERS += ("flashbax-x64",)
#: leaves of the tiny-leaf check: 32 at priority 1, leaf 17 at 1e-6 (as gper's own GPU test)
TINY_N, TINY_LEAF, TINY_P = 32, 17, 1e-6
DISTINCT = np.array([1e-3, 1e-2, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0])
#: |z| above Z_SUSPECT is reported as suspect, above Z_LIMIT as a deviation (in probability terms, the
#: tiny-leaf check uses the Poisson tails P_SUSPECT and P_LIMIT instead)
Z_SUSPECT, Z_LIMIT = 4.0, 6.0
P_SUSPECT, P_LIMIT = 1e-3, 1e-6
#: the name each check has in the results and the report
CHECK_NAMES = {"reach": "reach", "tiny": "tiny leaf", "distinct": "distinct"}
STATUS_PEER = {"gper-stratified": "gper", "torchrl-fp64": "torchrl"}  # whose installation a sampler needs


def log(msg: str) -> None:
    print(f"[peer_exactness] {msg}", file=sys.stderr, flush=True)


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


# ----------------------------------------------------------------------------------------------
# samplers: set priorities on n slots, then draw batches of indices


class Sampler:
    """One peer's sampler over ``n`` slots. Subclasses define :meth:`load` and :meth:`draw`."""

    kind = "iid"  # or "stratified": one draw per equal-mass stratum of each batch
    max_slots: int | None = None

    def load(self, prios: np.ndarray) -> None:
        raise NotImplementedError

    def draw(self, k: int):
        """Indices of one batch of ``k`` draws (a tensor or array; :meth:`count` adds them up)."""
        raise NotImplementedError

    def new_counts(self, n: int):
        return np.zeros(n, dtype=np.int64)

    def add_counts(self, counts, idx):
        counts += np.bincount(np.asarray(idx, dtype=np.int64), minlength=len(counts))
        return counts

    def finish(self, counts) -> np.ndarray:
        return np.asarray(counts, dtype=np.int64)

    def count(self, n: int, draws: int, k: int, budget_s: float) -> tuple[np.ndarray, int]:
        """Draw ``draws`` in batches of ``k`` (fewer if the budget runs out); hits per slot, draws made."""
        counts, done, t0 = self.new_counts(n), 0, time.perf_counter()
        while done < draws and (done == 0 or time.perf_counter() - t0 < budget_s):
            counts = self.add_counts(counts, self.draw(k))
            done += k
        return self.finish(counts), done


class TorchCounts(Sampler):
    """Counts kept on the sampler's torch device (no copy of every batch to the host)."""

    device = torch.device("cpu")

    def new_counts(self, n: int):
        return torch.zeros(n, dtype=torch.int64, device=self.device)

    def add_counts(self, counts, idx):
        return counts.index_add_(0, idx.long(), torch.ones_like(idx, dtype=torch.int64))

    def finish(self, counts) -> np.ndarray:
        return counts.cpu().numpy()


class GperSampler(TorchCounts):
    def __init__(self, device: torch.device, sampling: str) -> None:
        self.device, self.sampling = device, sampling
        self.kind = "stratified" if sampling == "stratified" else "iid"

    def load(self, prios: np.ndarray) -> None:
        import gper

        n = len(prios)
        self.rb = gper.PrioritizedReplayBuffer(
            n, {"x": ((), torch.uint8)}, alpha=1.0, eps=1e-12, sampling=self.sampling, device=self.device, seed=1
        )
        p = torch.from_numpy(prios.astype(np.float32)).to(self.device)
        for lo in range(0, n, 1 << 22):
            hi = min(lo + (1 << 22), n)
            self.rb.add({"x": torch.zeros(hi - lo, dtype=torch.uint8, device=self.device)})
            self.rb.update_priorities(torch.arange(lo, hi, device=self.device), p[lo:hi])

    def draw(self, k: int):
        return self.rb.sample(k).indices


class _SeedsShim(SeedsBaseline):
    """The seeds' sampling code (``sample_cumsum`` / ``sample_multinomial``) on a bare priority array."""

    def __init__(self, prio: torch.Tensor) -> None:  # no fields: the checks need indices only
        self.prio, self.capacity, self.device = prio, len(prio), prio.device

    def _gather(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"indices": idx}


class SeedsSampler(TorchCounts):
    def __init__(self, device: torch.device, multinomial: bool) -> None:
        self.device, self.multinomial = device, multinomial
        self.max_slots = 2**24 if multinomial else None  # torch refuses more categories

    def load(self, prios: np.ndarray) -> None:
        self.shim = _SeedsShim(torch.from_numpy(prios.astype(np.float32)).to(self.device))

    def draw(self, k: int):
        return (self.shim.sample_multinomial if self.multinomial else self.shim.sample_cumsum)(k)["indices"]


class TorchRLSampler(Sampler):
    """TorchRL's PrioritizedReplayBuffer with its C++ CPU tree (the PyPI build), over a 1-byte field.

    ``dtype`` is the trees' (TorchRL's default float32, or the float64 it offers). A buffer with
    float64 trees cannot be filled: ``extend`` marks the new slots with a float32 default priority
    that the float64 tree refuses ("expected scalar type Double but found Float", TorchRL 0.13.3
    and 0.14.1). So for float64 the sampler is driven as the buffer drives it (``update_priority``,
    then ``sample(storage, k)``) over a storage filled by a plain buffer.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype

    def load(self, prios: np.ndarray) -> None:
        import logging

        logging.getLogger("torchrl").setLevel(logging.WARNING)
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer, PrioritizedSampler, ReplayBuffer

        n = len(prios)
        self.storage = LazyTensorStorage(n, device="cpu")
        if self.dtype == torch.float64:
            self.sampler = PrioritizedSampler(n, 1.0, 0.4, 1e-12, dtype=self.dtype, device="cpu")
            writer = ReplayBuffer(storage=self.storage)
        else:
            self.sampler = None
            writer = self.rb = PrioritizedReplayBuffer(
                alpha=1.0, beta=0.4, eps=1e-12, storage=self.storage, sampler_device="cpu"
            )
        for lo in range(0, n, 1 << 22):
            hi = min(lo + (1 << 22), n)
            writer.extend(TensorDict({"x": torch.zeros(hi - lo, dtype=torch.uint8)}, batch_size=[hi - lo]))
            p = torch.from_numpy(prios[lo:hi]).to(self.dtype)
            (self.sampler or self.rb).update_priority(torch.arange(lo, hi), p)

    def draw(self, k: int):
        if self.sampler is not None:
            return self.sampler.sample(self.storage, k)[0].numpy()
        return self.rb.sample(k, return_info=True)[1]["index"].numpy()


class CpprbSampler(Sampler):
    kind = "stratified"

    def load(self, prios: np.ndarray) -> None:
        from cpprb import PrioritizedReplayBuffer

        n = len(prios)
        self.rb = PrioritizedReplayBuffer(n, {"x": {"dtype": np.uint8}}, alpha=1.0, eps=1e-12)
        for lo in range(0, n, 1 << 22):
            hi = min(lo + (1 << 22), n)
            self.rb.add(x=np.zeros(hi - lo, dtype=np.uint8))
            self.rb.update_priorities(np.arange(lo, hi), prios[lo:hi].astype(np.float32))

    def draw(self, k: int):
        return self.rb.sample(k)["indexes"]


class FlashbaxSampler(Sampler):
    """flashbax's sum tree: what its prioritised buffers set (on GPU) and draw from, counts kept in JAX."""

    kind = "stratified"

    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp
        from flashbax.buffers import sum_tree

        self.jax, self.jnp, self.st = jax, jnp, sum_tree
        self.key = jax.random.PRNGKey(1)
        self.set = jax.jit(sum_tree.set_batch_bincount)
        self.add = jax.jit(lambda counts, idx: counts.at[idx].add(1), donate_argnums=0)
        self.sample = jax.jit(sum_tree.stratified_sample, static_argnums=1)

    def load(self, prios: np.ndarray) -> None:
        jnp, n = self.jnp, len(prios)
        self.tree = self.st.init(n)
        for lo in range(0, n, 1 << 22):
            hi = min(lo + (1 << 22), n)
            self.tree = self.set(self.tree, jnp.arange(lo, hi), jnp.asarray(prios[lo:hi], dtype=jnp.float32))

    def draw(self, k: int):
        self.key, sub = self.jax.random.split(self.key)
        return self.sample(self.tree, k, sub)

    def new_counts(self, n: int):
        return self.jnp.zeros(n, dtype=self.jnp.int32)

    def add_counts(self, counts, idx):
        return self.add(counts, idx)

    def finish(self, counts) -> np.ndarray:
        return np.asarray(counts, dtype=np.int64)


def make_sampler(peer: str, device: torch.device) -> Sampler:
    if peer == "gper":
        return GperSampler(device, "proportional")
    if peer == "gper-stratified":
        return GperSampler(device, "stratified")
    if peer in ("seeds", "multinomial"):
        return SeedsSampler(device, peer == "multinomial")
    if peer in ("torchrl", "torchrl-fp64"):
        return TorchRLSampler(torch.float64 if peer == "torchrl-fp64" else torch.float32)
    if peer == "cpprb":
        return CpprbSampler()
    if peer in JAX_PEERS:
        return FlashbaxSampler()
    raise ValueError(f"unknown peer {peer!r}")


# ----------------------------------------------------------------------------------------------
# the checks


def _hit_probability(q: np.ndarray, draws: int, kind: str, k: int) -> np.ndarray:
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


def check_reach(s: Sampler, peer: str, log2n: int, per_slot: float, k: int, budget_s: float) -> Result:
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
    hit = _hit_probability(q, r.draws, s.kind, r.batch)
    got = counts > 0
    r.observed, r.expected = float(got.mean()), float(hit.mean())
    r.z = (r.observed - r.expected) / (math.sqrt(float((hit * (1 - hit)).sum())) / n)
    odd = slice(n // 2 + 1, None, 2)  # where a float32 threshold at the upper end loses every other slot
    r.extra = f"upper-half odd slots {got[odd].mean():.4f} (exact {hit[odd].mean():.4f})"
    r.verdict = _verdict(r.z, r.observed < r.expected, "slots missed", "too even")
    return r


def check_tiny(s: Sampler, peer: str, draws: int, k: int, budget_s: float) -> Result:
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


def check_distinct(s: Sampler, peer: str, draws: int, k: int, budget_s: float) -> Result:
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


# ----------------------------------------------------------------------------------------------
# running


@dataclass
class ExactConfig:
    device: torch.device
    peers: list[str]
    reach_log2: int
    reach_per_slot: float
    tiny_draws: int
    distinct_draws: int
    batch: int
    budget_s: float
    out: Path | None
    checks: tuple[str, ...] = ("reach", "tiny", "distinct")
    #: ``time.monotonic()`` after which no check starts (the rest is reported as not run)
    deadline: float | None = None

    def budget(self) -> float:
        """Seconds of drawing for the next check: ``budget_s``, or less when the deadline is near."""
        left = math.inf if self.deadline is None else self.deadline - time.monotonic()
        return max(min(self.budget_s, left), 0.0)


def run_checks(cfg: ExactConfig, peer: str, sampler: Sampler) -> list[Result]:
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


def run(cfg: ExactConfig) -> list[Result]:
    env = environment(cfg.device)
    versions, absent, results = {}, {}, []
    for peer in cfg.peers:
        ok, text = peer_status(STATUS_PEER.get(peer, peer), cfg.device)
        if not ok:
            absent[peer] = text
            log(f"skipping {peer}: {text}")
            continue
        versions[peer] = text
        if peer in JAX_PEERS and cfg.budget() <= 0:
            results += [Result(peer, CHECK_NAMES[c], 0, verdict="not run: past --deadline-s") for c in cfg.checks]
        elif peer in JAX_PEERS:
            got, text = run_worker(cfg, peer)
            versions[peer] = text or versions[peer]
            results += got
        else:
            results += run_checks(cfg, peer, make_sampler(peer, cfg.device))
    text = report(cfg, env, versions, absent, results)
    if cfg.out is not None:
        cfg.out.mkdir(parents=True, exist_ok=True)
        path = cfg.out / f"peer-exactness-{env['slug']}-{env['stamp']}.md"
        path.write_text(text, encoding="utf-8")
        log(f"wrote {path}")
    return results


def run_worker(cfg: ExactConfig, peer: str) -> tuple[list[Result], str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", peer, "--worker-out", str(out)]
        cmd += ["--device", cfg.device.type, "--reach-log2", str(cfg.reach_log2)]
        cmd += ["--reach-per-slot", str(cfg.reach_per_slot), "--tiny-draws", str(cfg.tiny_draws)]
        cmd += ["--distinct-draws", str(cfg.distinct_draws), "--batch", str(cfg.batch), "--budget-s", str(cfg.budget_s)]
        cmd += ["--checks", *cfg.checks]
        timeout = None
        if cfg.deadline is not None:
            left = max(cfg.deadline - time.monotonic(), 0.0)
            cmd += ["--deadline-s", f"{left:.1f}"]
            timeout = left + 60  # the worker's last check may start just before the deadline
        env = dict(os.environ)
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        if cfg.device.type != "cuda":
            env["JAX_PLATFORMS"] = "cpu"
        here = Path(__file__).resolve()
        env["PYTHONPATH"] = os.pathsep.join([str(here.parents[1] / "src"), *filter(None, [env.get("PYTHONPATH")])])
        try:
            proc = subprocess.run(cmd, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc = None
        if not out.exists():
            how = "ran past its time limit" if proc is None else f"exited with status {proc.returncode}"
            note = f"error: the {peer} worker {how} and wrote no results"
            return [Result(peer, CHECK_NAMES[c], 0, verdict=note) for c in cfg.checks], ""
        done = json.loads(out.read_text())
    return [Result(**r) for r in done["results"]], done["versions"]


def worker_main(cfg: ExactConfig, peer: str, out: Path) -> int:
    import jax

    x64 = peer == "flashbax-x64"
    if x64:
        jax.config.update("jax_enable_x64", True)
    results = run_checks(cfg, peer, FlashbaxSampler())
    out.write_text(json.dumps({"results": [asdict(r) for r in results], "versions": jax_versions(x64)}))
    return 0


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def report(cfg: ExactConfig, env: dict, versions: dict, absent: dict, results: list[Result]) -> str:
    head = header_line(env, "peer exactness")
    lines = [f"# {head}", "", "Peers: " + "; ".join(f"{p}: {v}" for p, v in versions.items())]
    if absent:
        lines[-1] += ". Skipped: " + "; ".join(f"{p} ({why})" for p, why in absent.items())
    lines += [
        "",
        f"Priority exponent 1 everywhere (the stored priorities are those given). Each check draws batches of "
        f"{cfg.batch:,} (fewer where there are fewer slots for reach) until its target or {cfg.budget_s:g} s; "
        "expectations are for the draws made. iid = independent draws, stratified = one draw per equal-mass "
        f"stratum of a batch. A reach deficit beyond |z| = {Z_LIMIT:g} is flagged (beyond {Z_SUSPECT:g}: suspect); "
        f"a tiny-leaf count whose Poisson tail is below {P_LIMIT:g} is flagged (below {P_SUSPECT:g}: suspect).",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
    ]
    tables = []
    reach = [r for r in results if r.check == "reach"]
    if reach:
        headers = [
            "peer",
            "slots",
            "draws",
            "batch",
            "kind",
            "coverage",
            "exact",
            "z",
            "where it shows",
            "verdict",
            "s",
        ]
        rows = [
            [r.peer, f"2^{int(math.log2(r.slots))}" if r.slots else "", f"{r.draws:,}", f"{r.batch:,}", r.kind,
             _num(r.observed, ".4f"), _num(r.expected, ".4f"), _num(r.z, ".1f"), r.extra, r.verdict, f"{r.seconds:.0f}"]
            for r in reach
        ]  # fmt: skip
        tables.append(("reach: fraction of slots drawn at least once, uniform-ish priorities", (headers, rows)))
    tiny = [r for r in results if r.check == "tiny leaf"]
    if tiny:
        headers = ["peer", "draws", "kind", "hits of the 1e-6 leaf", "expected", "z", "", "verdict", "s"]
        rows = [
            [r.peer, f"{r.draws:,}", r.kind, _num(r.observed, ".0f"), _num(r.expected, ".1f"), _num(r.z, ".1f"),
             r.extra, r.verdict, f"{r.seconds:.0f}"]
            for r in tiny
        ]  # fmt: skip
        tables.append(("tiny leaf: 32 leaves at 1, one at 1e-6", (headers, rows)))
    distinct = [r for r in results if r.check == "distinct"]
    if distinct:
        headers = ["peer", "draws", "kind", "chi-square (7 df)", "", "verdict", "s"]
        rows = [
            [r.peer, f"{r.draws:,}", r.kind, _num(r.observed, ".1f"), r.extra, r.verdict, f"{r.seconds:.0f}"]
            for r in distinct
        ]
        tables.append((f"distinct: 8 leaves at {', '.join(f'{p:g}' for p in DISTINCT)}", (headers, rows)))
    print("\n".join(lines[:3]))
    for title, (headers, rows) in tables:
        right = [False] * len(headers)
        print()
        print_table(headers, rows, right, title=title)
        lines += [f"## {title}", "", format_markdown(headers, rows, right), ""]
    return "\n".join(lines)


def _count(text: str) -> int:
    """``"2^30"``, ``"1e9"`` or ``"1000"`` as a number of draws."""
    t = text.replace("**", "^")
    try:
        return 2 ** int(t[2:]) if t.startswith("2^") else int(float(t))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS), help="whose samplers (default all)")
    p.add_argument("--checks", nargs="+", choices=("reach", "tiny", "distinct"), default=["reach", "tiny", "distinct"])
    p.add_argument("--reach-log2", type=int, help="slots of the reach check (default CUDA 25, CPU 22)")
    p.add_argument("--reach-per-slot", type=float, default=1.0, help="draws per slot in the reach check (1)")
    p.add_argument("--tiny-draws", type=_count, help="draws of the tiny-leaf check (default CUDA 2^32, CPU 2^30)")
    p.add_argument("--distinct-draws", type=_count, help="draws of the distinct check (default CUDA 2^26, CPU 2^24)")
    p.add_argument("--batch", type=_count, default=1 << 20, help="draws per call (default 2^20)")
    p.add_argument("--budget-s", type=float, help="seconds of drawing per check and peer (default CUDA 10, CPU 60)")
    p.add_argument("--deadline-s", type=float, help="start no check after this many seconds (report what ran)")
    p.add_argument("--out", default="benchmarks/results", help="results directory (default benchmarks/results)")
    p.add_argument("--worker", choices=JAX_PEERS, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    cfg = ExactConfig(
        device=device,
        peers=list(dict.fromkeys(args.peers)),
        reach_log2=args.reach_log2 or (25 if cuda else 22),
        reach_per_slot=args.reach_per_slot,
        tiny_draws=int(args.tiny_draws or (2**32 if cuda else 2**30)),
        distinct_draws=int(args.distinct_draws or (2**26 if cuda else 2**24)),
        batch=args.batch,
        budget_s=args.budget_s or (10.0 if cuda else 60.0),
        out=Path(args.out),
        checks=tuple(dict.fromkeys(args.checks)),
        deadline=None if args.deadline_s is None else time.monotonic() + args.deadline_s,
    )
    if args.worker:
        return worker_main(cfg, args.worker, args.worker_out)
    results = run(cfg)
    return 1 if any(r.verdict.startswith("error") for r in results if r.peer.startswith("gper")) else 0


if __name__ == "__main__":
    sys.exit(main())

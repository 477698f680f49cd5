"""``gper bench exactness``: can every slot be drawn, and does each leaf come up as often as it should?

Runs the checks of :mod:`gper.bench.checks` (reach, tiny leaf, distinct) on every peer's own
sampler: the peers of ``gper bench peers``, plus gper's stratified mode and TorchRL with the
float64 trees it offers; each imported lazily and skipped with a message when absent. flashbax
runs in a worker process per variant (float32, and float64 through ``jax_enable_x64``, a
process-wide switch). The report goes to ``--out/peer-exactness-<device>-<stamp>.md`` and is
printed.
"""

from __future__ import annotations

import math
import sys

from gper.bench import peers
from gper.bench.checks import (
    CHECK_NAMES,
    DISTINCT,
    P_LIMIT,
    P_SUSPECT,
    Z_LIMIT,
    Z_SUSPECT,
    ExactConfig,
    Result,
    run_checks,
)
from gper.bench.harness import make_log
from gper.bench.peers import flashbax as flashbax_peer
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table

PEERS = ("gper", "gper-stratified", "cumsum", "multinomial", "torchrl", "torchrl-fp64", "cpprb", "flashbax")
PEERS += ("flashbax-x64",)
JAX_PEERS = flashbax_peer.NAMES

log = make_log("gper bench exactness")


def run(cfg: ExactConfig) -> list[Result]:
    """Every check on every peer of ``cfg``; print the report and write it (unless ``cfg.out`` is None)."""
    env = environment(cfg.device)
    versions, absent, results = {}, {}, []
    cfg.peers = list(dict.fromkeys(peers.canonical_name(p) for p in cfg.peers))
    for peer in cfg.peers:
        ok, text = peers.status(peer, cfg.device)
        if not ok:
            absent[peer] = text
            log(f"skipping {peer}: {text}")
            continue
        versions[peer] = text
        if peer in JAX_PEERS and cfg.budget() <= 0:
            results += [Result(peer, CHECK_NAMES[c], 0, verdict="not run: past --deadline-s") for c in cfg.checks]
        elif peer in JAX_PEERS:
            got, text = _run_worker(cfg, peer)
            versions[peer] = text or versions[peer]
            results += got
        else:
            results += run_checks(cfg, peer, peers.load(peer).sampler(peer, cfg.device), log)
    text = report(cfg, env, versions, absent, results)
    if cfg.out is not None:
        files = ResultFiles(cfg.out, env, None, prefix="peer-exactness")
        files.write_markdown(text)
        log(f"wrote {files.md_path}")
    return results


def _run_worker(cfg: ExactConfig, peer: str) -> tuple[list[Result], str]:
    timeout = None
    if cfg.deadline is not None:
        timeout = max(cfg.left_s(), 0.0) + 60  # the worker's last check may start just before the deadline
    got, versions, why = flashbax_peer.check_in_worker(peer, cfg.to_payload(), cfg.device, timeout)
    if got is None:
        note = f"error: the {peer} worker {why or 'exited'} and wrote no results"
        return [Result(peer, CHECK_NAMES[c], 0, verdict=note) for c in cfg.checks], ""
    return [Result(**r) for r in got], versions


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def report(cfg: ExactConfig, env: dict, versions: dict, absent: dict, results: list[Result]) -> str:
    """Print the report and return it as Markdown."""
    head = header_line(env, "peer exactness")
    lines = [f"# {head}", "", "Peers: " + "; ".join(f"{p}: {v}" for p, v in versions.items())]
    if absent:
        lines[-1] += ". Skipped: " + "; ".join(f"{p} ({why})" for p, why in absent.items())
    command = cfg.command or f"python {' '.join(sys.argv)}"
    lines += [
        "",
        f"Priority exponent 1 everywhere (the stored priorities are those given). Each check draws batches of "
        f"{cfg.batch:,} (fewer where there are fewer slots for reach) until its target or {cfg.budget_s:g} s; "
        "expectations are for the draws made. iid = independent draws, stratified = one draw per equal-mass "
        f"stratum of a batch. A reach deficit beyond |z| = {Z_LIMIT:g} is flagged (beyond {Z_SUSPECT:g}: suspect); "
        f"a tiny-leaf count whose Poisson tail is below {P_LIMIT:g} is flagged (below {P_SUSPECT:g}: suspect).",
        "",
        f"Command: `{command}`",
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

"""``gper bench checkpoint``: how long a buffer takes to save and load, and the host memory it needs.

A buffer of the reference transition (:mod:`gper.bench.workload`) is filled on the device and
saved with :meth:`~gper.PrioritizedReplayBuffer.save` (streamed a chunk at a time, fsynced,
renamed into place), then loaded back into a second buffer with
:meth:`~gper.PrioritizedReplayBuffer.load`, twice: once from the page cache and once cold (the
file's pages dropped from the cache first with ``posix_fadvise``). For comparison, ``torch.save``
of the buffer's ``state_dict`` to the same disk, and ``torch.load`` of it.

Peak host memory is the process's peak resident set (``VmHWM``, reset before each operation
through ``/proc/self/clear_refs``) minus its resident set before the operation: what the
operation added. Linux only; elsewhere that column is empty.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

import gper
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.workload import ALPHA, BETA, EPS, FILL_CHUNK, SPEC, format_capacity, random_td, random_transitions

COLUMNS = ["op", "capacity", "file_gib", "seconds", "gib_per_s", "peak_host_mib", "note"]


@dataclass
class CheckpointBenchConfig:
    capacities: list[int]
    device: torch.device
    folder: Path  # where the files are written (a local disk), deleted after each capacity
    out: Path  # results directory
    torch_save: bool = True  # also time torch.save / torch.load of the state_dict
    command: str = ""


def _status(field: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (``VmRSS``, ``VmHWM``), or None off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextlib.contextmanager
def _peak_host_memory(out: dict[str, float | None]):
    """Measure the resident set the body adds at its peak, in MiB, into ``out["peak_host_mib"]``."""
    before = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # reset VmHWM to the current resident set
        resettable = True
    except OSError:
        resettable = False
    yield
    peak = _status("VmHWM")
    ok = resettable and before is not None and peak is not None
    out["peak_host_mib"] = (peak - before) / 2**20 if ok else None


def _drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _build(capacity: int, device: torch.device) -> gper.PrioritizedReplayBuffer:
    return gper.PrioritizedReplayBuffer(capacity, SPEC, alpha=ALPHA, beta=BETA, eps=EPS, device=device, seed=1)


def _fill(rb: gper.PrioritizedReplayBuffer, device: torch.device) -> None:
    g = torch.Generator(device=device).manual_seed(0)
    for lo in range(0, rb.capacity, FILL_CHUNK):
        n = min(FILL_CHUNK, rb.capacity - lo)
        slots = rb.add(random_transitions(n, device, g))
        rb.update_priorities(slots, random_td(n, device, g))


def _timed(op: str, capacity: int, nbytes: int, fn, note: str = "") -> dict[str, object]:
    mem: dict[str, float | None] = {}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with _peak_host_memory(mem):
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    gib = nbytes / 2**30
    return {
        "op": op,
        "capacity": format_capacity(capacity),
        "file_gib": round(gib, 3),
        "seconds": round(dt, 3),
        "gib_per_s": round(gib / dt, 3),
        "peak_host_mib": None if mem["peak_host_mib"] is None else round(mem["peak_host_mib"], 1),
        "note": note,
    }


def _same(a: gper.PrioritizedReplayBuffer, b: gper.PrioritizedReplayBuffer) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if isinstance(sa[k], torch.Tensor))


def _one_capacity(cfg: CheckpointBenchConfig, capacity: int, log) -> list[dict[str, object]]:
    rows = []
    rb = _build(capacity, cfg.device)
    _fill(rb, cfg.device)
    path = cfg.folder / f"replay-{capacity}.safetensors"
    log(f"capacity {format_capacity(capacity)}: {rb.rows.nbytes / 2**30:.2f} GiB of rows; saving to {path}")
    row = _timed("save", capacity, rb.rows.nbytes, lambda: rb.save(path))
    size = path.stat().st_size
    row["file_gib"] = round(size / 2**30, 3)
    rows.append(row)
    warm = _build(capacity, cfg.device)
    rows.append(_timed("load (page cache)", capacity, size, partial(warm.load, path), "file just written"))
    del warm
    _drop_from_page_cache(path)
    cold = _build(capacity, cfg.device)
    rows.append(_timed("load (cold)", capacity, size, partial(cold.load, path), "file dropped from page cache"))
    if not _same(rb, cold):
        raise AssertionError("the loaded buffer differs from the saved one")
    del cold
    path.unlink()
    if cfg.torch_save:
        pt = cfg.folder / f"replay-{capacity}.pt"
        rows.append(_timed("torch.save(state_dict)", capacity, rb.rows.nbytes, lambda: torch.save(rb.state_dict(), pt)))
        _drop_from_page_cache(pt)
        size = pt.stat().st_size

        def load() -> None:
            torch.load(pt, map_location=cfg.device, weights_only=True)

        rows.append(_timed("torch.load (cold)", capacity, size, load, "to the device, weights_only"))
        pt.unlink()
    return rows


def run_checkpoint_bench(cfg: CheckpointBenchConfig, log=print) -> list[dict[str, object]]:
    """Time save and load at each capacity; print the table and write it under ``cfg.out``."""
    env = environment(cfg.device)
    files = ResultFiles(cfg.out, env, COLUMNS, prefix="checkpoint")
    rows: list[dict[str, object]] = []
    cfg.folder.mkdir(parents=True, exist_ok=True)
    log(header_line(env, "bench checkpoint"))
    for capacity in cfg.capacities:
        rows += _one_capacity(cfg, capacity, log)
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
        files.rewrite(rows)
    headers = COLUMNS
    cells = [["" if r[c] is None else str(r[c]) for c in headers] for r in rows]
    right = [False, True, True, True, True, True, False]
    print_table(headers, cells, right, title=header_line(env, "bench checkpoint"))
    text = f"{header_line(env, 'bench checkpoint')}\n\n{cfg.command}\n\n{format_markdown(headers, cells, right)}\n"
    text += (
        "\npeak_host_mib: the process's peak resident set during the operation minus its resident set before "
        "(VmHWM reset through /proc/self/clear_refs). save: write to a temporary file a chunk at a time, fsync, "
        "rename. load (cold): the file's pages dropped from the page cache first (posix_fadvise DONTNEED).\n"
    )
    files.write_markdown(text)
    log(f"wrote {files.csv_path} and {files.md_path}")
    return rows

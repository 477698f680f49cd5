"""Benchmarks that run each case in a process of its own, several side by side (the walk-forward
benchmarks: a run per series, seed and setting, sharing one GPU or the CPU's cores).

A case is a JSON-serialisable dict handed to ``<script> --worker '<json>'``; the worker prints one
JSON line, its result, as the last line of its standard output, and writes its log to standard
error, which goes to a file of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def launch(script: Path, spec: dict[str, Any], log_path: Path) -> tuple[dict[str, Any] | None, float, str]:
    """Run ``script --worker <spec>`` to its end: ``(its result or None, wall seconds, "ok" or why not)``."""
    t0 = time.perf_counter()
    cmd = [sys.executable, str(script), "--worker", json.dumps(spec)]
    with Path(log_path).open("w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return None, wall, f"exit {proc.returncode} (see {log_path})"
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall, "ok"


def run_all(
    script: Path, specs: list[dict[str, Any]], parallel: int, logs: Path
) -> list[tuple[dict[str, Any], dict[str, Any] | None, float, str]]:
    """Every case of ``specs`` through :func:`launch`, ``parallel`` at a time, a line printed as each
    ends (named by its ``run_name``), logs in ``logs/run<k>.log``: ``(spec, result, wall, status)`` in
    the order of ``specs``."""

    def job(i_spec):
        i, spec = i_spec
        out, wall, status = launch(script, dict(spec), Path(logs) / f"run{i:03d}.log")
        print(f"  [{i + 1}/{len(specs)}] {spec.get('run_name')}: {status} in {wall:.0f} s", flush=True)
        return spec, out, wall, status

    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(job, enumerate(specs)))


__all__ = ["launch", "run_all"]

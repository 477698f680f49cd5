"""``gper bench trainers``: PureJaxRL's DQN beside ``gper train`` on CartPole-v1, in one run.

PureJaxRL runs in a worker process (:mod:`gper.bench.trainers.purejaxrl_run`), N seeds in one
``jax.vmap`` for each N asked; gper then runs in this process (:mod:`gper.bench.trainers.gper_run`),
one seed per run. The table and the files are :mod:`gper.bench.trainers.table`'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gper.bench.report import ResultFiles, environment, header_line, print_table
from gper.bench.trainers import gper_run, purejaxrl_run, table

PUREJAXRL = ("PureJaxRL", "its CartPole-v1 defaults")
#: PureJaxRL's train() replaces its seed's key by PRNGKey(0) after the first env reset (upstream code,
#: kept as it is): the network init and every later key are the same for all seeds of a vmap
SEED_NOTE = (
    "PureJaxRL's train() draws the first env reset from its seed and everything after it (network init, "
    "exploration, later resets) from PRNGKey(0), as upstream does: its seeds differ in their first reset only"
)


@dataclass(frozen=True)
class TrainersBenchConfig:
    """Settings of one ``gper bench trainers`` run.

    Attributes:
        seeds: the seed counts; PureJaxRL runs each as one vmap, gper each as one population (one seed:
            the single agent's run).
        preset_seeds: the seed counts of gper's cartpole-preset rows; None: ``seeds``.
        device: gper's device (``auto``, ``cuda``, ``cpu``); JAX picks its own (its default backend).
        out: the results directory.
        total_steps: override both trainers' env steps per seed (smoke runs); None keeps each one's own.
        worker_timeout_s: the PureJaxRL worker is stopped after this many seconds.
        trainers: which of ``purejaxrl`` and ``gper`` to run.
        command: the command line, for the report.
    """

    seeds: tuple[int, ...] = (1, 16, 64, 256)
    preset_seeds: tuple[int, ...] | None = None
    device: str = "auto"
    out: Path = Path("benchmarks/results")
    total_steps: int | None = None
    worker_timeout_s: float = 540.0
    trainers: tuple[str, ...] = ("purejaxrl", "gper")
    command: str = ""


def _torch_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _labelled(rows: Sequence[dict[str, Any]], trainer: str, settings: str) -> list[dict[str, Any]]:
    return [{"trainer": trainer, "settings": settings, **r} for r in rows]


def purejaxrl_rows(cfg: TrainersBenchConfig) -> tuple[list[dict[str, Any]], str]:
    """PureJaxRL's rows (skipped ones when JAX, gymnax or flashbax is missing) and its versions line."""
    ok, text = purejaxrl_run.status()
    if not ok:
        return _labelled([{"seeds": n, "status": f"skipped: {text}"} for n in cfg.seeds], *PUREJAXRL), text
    with tempfile.TemporaryDirectory(prefix="gper-bench-purejaxrl-") as tmp:
        out = Path(tmp) / "purejaxrl.json"
        cmd = [sys.executable, "-m", "gper.bench.trainers.purejaxrl_run", "--json", str(out), "--seeds"]
        cmd += [str(n) for n in cfg.seeds] + (["--total-steps", str(cfg.total_steps)] if cfg.total_steps else [])
        # JAX takes 75% of the GPU's memory at start unless told not to; the gper runs come after it
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", **os.environ}
        failure = None
        try:
            proc = subprocess.run(cmd, env=env, timeout=cfg.worker_timeout_s, check=False)
            if proc.returncode != 0:
                failure = f"error: the PureJaxRL worker exited with status {proc.returncode} (its output is above)"
        except subprocess.TimeoutExpired:
            failure = f"error: the PureJaxRL worker ran past {cfg.worker_timeout_s:.0f} s (--worker-timeout-s)"
        done = json.loads(out.read_text(encoding="utf-8"))["rows"] if out.exists() else []
    rows = [{**r, "status": f"error: {r['error']}"} if "error" in r else r for r in done]
    ran = {r["seeds"] for r in rows}
    rows += [{"seeds": n, "status": failure or "error: no result"} for n in cfg.seeds if n not in ran]
    return _labelled(rows, *PUREJAXRL), text


def gper_rows(cfg: TrainersBenchConfig) -> list[dict[str, Any]]:
    """gper's rows: each of :data:`~gper.bench.trainers.gper_run.GPER_ROWS` at each seed count."""
    configs = gper_run.gper_configs(purejaxrl_run.default_config(), cfg.device, cfg.total_steps)
    rows = []
    preset_seeds = cfg.seeds if cfg.preset_seeds is None else cfg.preset_seeds
    for (trainer, settings), fields in zip(gper_run.GPER_ROWS, configs, strict=True):
        for n in preset_seeds if settings == "cartpole preset" else cfg.seeds:
            print(f"gper: {settings}, {n} seed(s) ...", file=sys.stderr, flush=True)
            try:
                row = gper_run.run_gper(fields, n, log=lambda line: print(line, file=sys.stderr, flush=True))
            except Exception as e:  # a failed run is a row of the table, not the end of the bench
                row = {"seeds": n, "status": f"error: {type(e).__name__}: {e}"}
            rows.append({"trainer": trainer, "settings": settings, **row})
    return rows


def notes(cfg: TrainersBenchConfig, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The notes under the table: how each number is had, and where the two trainers' settings differ."""
    pjx = gper_run.purejaxrl_settings(purejaxrl_run.default_config())
    shown = ("num_envs", "hidden", "batch_size", "buffer_size", "train_every", "target_every", "learning_starts")
    out = [
        "PureJaxRL: compile = jax.jit(jax.vmap(make_train(config))).lower(rngs).compile(); run = the compiled "
        "call, through jax.block_until_ready; env steps/s = seeds x env steps per seed / run s; its time to the "
        "goal is an estimate (~): run s x env step at the goal / env steps per seed, compilation not included",
        "gper: compile/setup = the train() call's time outside its training loop; run = its training wall time; "
        "N seeds are one run of a population of N (gper train --population N, agent i seed 1 + i); its s to "
        "goal is the median over the agents that reached it; "
        f"gper runs with {', '.join(f'{k}={v}' for k, v in gper_run.QUIET.items())} (PureJaxRL does none of these)",
        "gper at PureJaxRL's settings: " + ", ".join(f"{k}={pjx[k]}" for k in shown) + ", sampling=uniform, "
        "double_q=False, max_grad_norm=0, loss=mse; it differs from PureJaxRL in: "
        + "; ".join(gper_run.NOT_EXPRESSIBLE),
        SEED_NOTE,
    ]
    for r in rows:
        if r.get("solve_steps") and len(r["solve_steps"]) > 1:
            out.append(
                f"{r['trainer']} {r['settings']}, {r['seeds']} seeds: env steps at the goal "
                f"{table.seed_spread(r['solve_steps'])}"
            )
        if r.get("all_at_goal_s") is not None and r["seeds"] > 1:
            out.append(
                f"{r['trainer']} {r['settings']}, {r['seeds']} seeds: every agent at the goal "
                f"{r['all_at_goal_s']:.1f} s into training, "
                f"{r['setup_s'] + r['all_at_goal_s']:.1f} s from the call's start"
            )
    if cfg.total_steps:
        out.append(f"a smoke run: every trainer ran {cfg.total_steps:,} env steps per seed (--total-steps)")
    return out


def run_trainers_bench(cfg: TrainersBenchConfig) -> list[dict[str, Any]]:
    """Run the bench, print its table and write ``trainers-<device>-<stamp>.{csv,md}``; return the rows."""
    env = environment(_torch_device(cfg.device))
    header = header_line(env, "bench trainers")
    print(header, flush=True)
    files = ResultFiles(cfg.out, env, table.CSV_COLUMNS, prefix="trainers")
    rows, versions = [], [f"command: {cfg.command}"] if cfg.command else []
    if "purejaxrl" in cfg.trainers:
        pjx_rows, text = purejaxrl_rows(cfg)
        rows += pjx_rows
        versions.append(f"PureJaxRL (vendored dqn.py): {text}")
        files.append([table.csv_row(r) for r in pjx_rows])
    if "gper" in cfg.trainers:
        g_rows = gper_rows(cfg)
        rows += g_rows
        files.append([table.csv_row(r) for r in g_rows])
    print_table(table.HEADERS, [table.table_row(r) for r in rows], table.RIGHT, title="trainers on CartPole-v1")
    all_notes = notes(cfg, rows)
    print("\n".join(f"- {n}" for n in all_notes))
    files.write_markdown(table.markdown(header, versions, rows, all_notes))
    print(f"gper bench trainers: wrote {files.csv_path} and {files.md_path}", flush=True)
    return rows

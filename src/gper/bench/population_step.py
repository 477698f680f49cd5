"""``gper bench train-step --population N ...``: the small training step of a population, launch by launch.

For each N (default 1, 16, 64 and 256) a population of N agents on the cartpole preset (4
environments each, a 256-256 network, batch 256, proportional PER; :class:`gper.dqn.population_agent.PopulationAgent`,
``gper train --population N``'s learner) and, as the baseline, the single agent of ``gper train``:

* **timed**: one iteration = one collect step + one learn step, both replayed from their CUDA
  graphs after a warm-up; CUDA events around ``steps`` back-to-back iterations give device time,
  the host clock around the same iterations wall time (median of ``repeats``,
  :func:`gper.bench.timing.time_steps`);
* **counted**: the same agent built without graphs runs ``profile_iterations`` iterations phase by
  phase under :mod:`torch.profiler`, one profile per phase: every device activity of the phase
  (kernels, memsets, memcopies: what a graph of it replays) is counted and its device time added,
  so the table says how many launches each phase makes, how long they keep the GPU busy, and
  which kernels cost the most. Launch counts need CUDA (on the CPU the columns stay empty). That
  learner's replay buffer still replays its own graphs, with what it runs outside them (an
  input's copy, say), which a step captured whole folds into its own graph or leaves out: the
  counts are those of the eager step, close to the graphed one's but not always equal.

The gap between the timed iteration and the sum of its kernels' times is launch latency and
idle time between kernels: where a graph replays many short kernels back to back, that gap is the
step's cost, and the remedy is fewer launches (fused or batched kernels).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import synchronize, time_steps

COLUMNS = [
    "learner",
    "agents",
    "device_us",
    "wall_us",
    "x_single",
    "env_steps_per_s",
    "launches",
    "kernel_us",
    "busy_pct",
    "collect_launches",
    "per_sample_launches",
    "upload_launches",
    "fwd_bwd_launches",
    "learn_launches",
    "per_update_launches",
    "adam_launches",
    "collect_us",
    "per_sample_us",
    "upload_us",
    "fwd_bwd_us",
    "learn_us",
    "per_update_us",
    "adam_us",
]
#: the learn step's phases: fwd_bwd and adam, or learn where one kernel runs both (gper.dqn.population_fused_learn)
PHASES = ("collect", "per_sample", "upload", "fwd_bwd", "learn", "per_update", "adam")


@dataclass
class PopulationBenchConfig:
    device: torch.device
    agents: tuple[int, ...] = (1, 16, 64, 256)
    env: str = "cartpole"
    steps: int = 200
    repeats: int = 5
    profile_iterations: int = 3
    top_kernels: int = 8
    out: Path | None = Path("benchmarks/results")
    overrides: dict[str, Any] = field(default_factory=dict)
    """more :class:`gper.dqn.Config` fields for every learner (tests: smaller sizes)"""


def _fields(cfg: PopulationBenchConfig, graphs: bool) -> dict[str, Any]:
    fields = dict(env=cfg.env, device=str(cfg.device), save=False, progress=False, tensorboard=False)
    return {**fields, "learning_starts": 256, "cuda_graphs": graphs, **cfg.overrides}


def _single(cfg: PopulationBenchConfig, graphs: bool):
    """``gper train``'s single agent (:class:`gper.dqn.Agent`), filled past a batch."""
    from gper.dqn import Config
    from gper.dqn.build import setup

    resolved, agent, _ = setup(Config(**_fields(cfg, graphs)), log=lambda *a: None)
    for _ in range(resolved.batch_size):
        agent.collect_step(None)
    return resolved, agent


def _population(cfg: PopulationBenchConfig, n: int, graphs: bool):
    """``gper train --population n``'s learner (also at n = 1: the population learner), filled past a batch."""
    from gper.dqn import Config
    from gper.dqn.config import resolve
    from gper.dqn.population_agent import PopulationAgent
    from gper.dqn.sweep import agent_configs

    resolved = resolve(Config(**_fields(cfg, graphs)), cfg.device)
    learner = PopulationAgent(agent_configs(resolved, n), cfg.device, 10**6)
    for _ in range(resolved.batch_size):
        learner.collect_step(None)
    return resolved, learner


def _iteration(learner):
    step = [0]

    def run() -> None:
        learner.collect_step(None)
        step[0] += 1
        learner.learn_step(step[0], None)

    return run


def _phase_calls(learner) -> list[tuple[str, Any]]:
    """(phase, function) of one iteration in order: the collect step's phases, then the learn step's."""
    return [*learner.collect.phases.items(), *learner.learn.phases.items()]


def count_launches(learner, iterations: int) -> tuple[dict[str, int], dict[str, float], dict[str, float]]:
    """Per phase: device activities per iteration and their device µs per iteration, over
    ``iterations`` eager iterations, one profile per phase; and µs per iteration by kernel name."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    launches: dict[str, float] = defaultdict(float)
    busy: dict[str, float] = defaultdict(float)
    kernels: dict[str, float] = defaultdict(float)
    step = 0
    for _ in range(iterations):
        step += 1
        for name, fn in _phase_calls(learner):
            synchronize(learner.device)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                synchronize(learner.device)
            for e in prof.events():
                if e.device_type == DeviceType.CUDA:
                    launches[name] += 1 / iterations
                    us = e.time_range.elapsed_us() / iterations
                    busy[name] += us
                    kernels[e.name] += us
        learner.update_target(step)
    return {k: round(v) for k, v in launches.items()}, dict(busy), dict(kernels)


def run_population_bench(cfg: PopulationBenchConfig, log=print) -> list[dict]:
    """Time and count the iteration of each population size; print the table, write the files
    (the matmuls at ``gper train``'s precision, TF32 on CUDA)."""
    from gper.dqn import Config
    from gper.dqn.config import resolve
    from gper.training.precision import matmul_precision

    with matmul_precision(resolve(Config(**_fields(cfg, True)), cfg.device).precision):
        return _run(cfg, log)


def _run(cfg: PopulationBenchConfig, log) -> list[dict]:
    env = environment(cfg.device)
    cuda = cfg.device.type == "cuda"
    rows: list[dict] = []
    top: dict[int, list[tuple[str, float]]] = {}
    base_wall = None
    for label, n in [("single agent", 1)] + [("population", n) for n in cfg.agents]:
        log(f"{label} of {n} ...")
        resolved, learner = _build(cfg, label, n, graphs=True)
        run = _iteration(learner)
        for _ in range(20):  # past the graphs' warm-up and capture
            run()
        gpu_ms, wall_ms = time_steps(run, cfg.steps, cfg.repeats, cfg.device)
        del learner, run
        row = {"learner": label, "agents": n, "device_us": gpu_ms * 1e3, "wall_us": wall_ms * 1e3}
        base_wall = base_wall or row["wall_us"]
        row["x_single"] = row["wall_us"] / base_wall
        row["env_steps_per_s"] = n * resolved.num_envs / (wall_ms * 1e-3)
        if cuda:
            _, eager = _build(cfg, label, n, graphs=False)
            launches, busy, kernels = count_launches(eager, cfg.profile_iterations)
            del eager
            row["launches"] = sum(launches.values())
            row["kernel_us"] = sum(busy.values())
            row["busy_pct"] = 100 * row["kernel_us"] / row["device_us"]
            for phase in PHASES:
                row[f"{phase}_launches"] = launches.get(phase, 0)
                row[f"{phase}_us"] = busy.get(phase, 0.0)
            top[n if label == "population" else 0] = sorted(kernels.items(), key=lambda kv: -kv[1])[: cfg.top_kernels]
        rows.append(row)
        if cuda:
            torch.cuda.empty_cache()
    report(cfg, env, rows, top, resolved, log)
    return rows


def _build(cfg: PopulationBenchConfig, label: str, n: int, graphs: bool):
    return _single(cfg, graphs) if label != "population" else _population(cfg, n, graphs)


def _cell(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def report(
    cfg: PopulationBenchConfig,
    env: dict,
    rows: list[dict],
    top: dict[int, list[tuple[str, float]]],
    resolved: Any,
    log: Any,
) -> None:
    """Print the table and write ``train-step-population-<device>-<stamp>.{csv,md}`` (with ``cfg.out``):
    ``top`` maps N (0: the single agent) to its costliest kernels, (name, µs per iteration)."""
    cuda = cfg.device.type == "cuda"
    settings = f"{cfg.env} preset"
    if cfg.overrides:  # what the run changed in it
        settings += f" with {', '.join(sorted(cfg.overrides))} set"
    title = (
        f"{settings} ({resolved.num_envs} envs an agent, {resolved.hidden}, batch {resolved.batch_size}, "
        f"{resolved.sampling}, {resolved.loss} loss): one collect + one learn step"
        + (", CUDA graphs" if cuda else ", eager (CPU)")
    )
    headers = ["learner", "agents", "device µs", "wall µs", "× single", "env steps/s", "launches", "kernel µs"]
    headers += ["busy %", *(f"{p} (n / µs)" for p in PHASES)]
    table = []
    for r in rows:
        cells = [r["learner"], str(r["agents"]), _cell(r["device_us"]), _cell(r["wall_us"]), _cell(r["x_single"], 2)]
        cells += [_cell(r["env_steps_per_s"]), _cell(r.get("launches")), _cell(r.get("kernel_us"))]
        cells += [_cell(r.get("busy_pct"))]
        for p in PHASES:
            n = r.get(f"{p}_launches")
            cells.append("-" if n is None else f"{n} / {r[f'{p}_us']:,.0f}")
        table.append(cells)
    right = [False] + [True] * (len(headers) - 1)
    head = header_line(env, "bench train-step --population")
    log(head)
    print_table(headers, table, right, title)
    notes = [
        "device µs / wall µs: one iteration replayed from its graphs (median of repeats); × single: wall time "
        "against the single agent's (gper train's Agent)",
        "launches, kernel µs: device activities (kernels, memsets, copies) of one iteration and the sum of their "
        f"device times, counted by torch.profiler on the same learner run without graphs ({cfg.profile_iterations} "
        "iterations, one profile per phase; its replay buffer replays its own graphs); busy % = kernel µs / device µs: "
        "the rest is the gaps between kernels (over 100 where the eager step runs work the graphed one does not)",
    ]
    if not cuda:
        notes.append("on the CPU: host times, no launch counts")
    kernel_lines = []
    for n, items in top.items():
        who = "the single agent" if n == 0 else f"{n} agents"
        kernel_lines.append(f"\nThe costliest kernels of an iteration, {who} (µs per iteration, no graphs):\n")
        kernel_lines.append(
            format_markdown(
                ["kernel", "µs"], [[name[:100].replace("|", "/"), f"{us:,.1f}"] for name, us in items], [False, True]
            )
        )
    for line in notes:
        log(f"- {line}")
    if cfg.out is None:
        return
    files = ResultFiles(cfg.out, env, COLUMNS, prefix="train-step-population")
    files.append([{k: r.get(k) for k in COLUMNS} for r in rows])
    md = [f"# gper bench train-step --population: {env['device']}", "", head, "", title, ""]
    md += [format_markdown(headers, table, right), "", *(f"- {n}" for n in notes), *kernel_lines, ""]
    files.write_markdown("\n".join(md))
    log(f"wrote {files.csv_path} and {files.md_path}")

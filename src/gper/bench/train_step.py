"""``gper bench --train``: the DQN training step of :mod:`gper.dqn`, with and without replay.

What is timed, for each precision (TF32, FP32, bf16 autocast), on the trainer's own step
(:class:`gper.dqn.Agent`, built with :meth:`~gper.dqn.Agent.for_learning`; by default the reference
network 51 -> 512 -> 512 -> 45, whose 51 inputs the agent pads to 52 zero-filled columns, see
:func:`gper.dqn.padded_width`):

* ``replay, one graph``: per_sample -> upload -> fwd_bwd -> per_update (alongside adam) -> adam,
  replayed as one CUDA graph back to back; CUDA events around the replays give GPU time per step,
  the host clock around the same replays (plus one final sync) gives wall time per step.
* ``fixed batch, one graph``: the same step fed from a fixed tensor batch through the agent's
  batch source (:class:`gper.dqn.FixedBatch`: IS weights 1, no draw, no priority update; beta is
  still annealed alongside adam): the bare learning step, for the replay overhead.
* ``replay, by phase``: one graph per phase with CUDA events between them, as the trainer's
  timed steps run: the per-phase times (here per_update runs in turn, before adam, not alongside
  it, so the phase times can add up to more than the one-graph step).
* ``replay, eager`` (TF32 only): every phase as plain launches (no graphs).

It also counts the step's floating-point work and memory traffic (:func:`step_flops`,
:func:`step_bytes`) and divides them by the GPU's peak rates, to say how far from the floor the
step runs. The replay is filled with random transitions before timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

import gper
from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import synchronize
from gper.bench.timing import time_steps as _time_steps

#: dense peak rates of an H100/H200 SXM (NVIDIA's datasheet), used for the floor on those GPUs
PEAK_TFLOPS = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4}
PEAK_TBPS = 4.8  # H200 HBM3e

COLUMNS = [
    "precision",
    "mode",
    "ms_per_step",
    "wall_ms_per_step",
    "busy_pct",
    "replay_overhead_pct",
    "per_sample_ms",
    "upload_ms",
    "fwd_bwd_ms",
    "adam_ms",
    "learn_ms",
    "per_update_ms",
    "gflop",
    "floor_ms",
    "x_floor",
]


@dataclass
class TrainBenchConfig:
    device: torch.device
    capacity: int = 2**24
    batch: int = 16384
    hidden: tuple[int, ...] = (512, 512)
    obs_dim: int = 51
    n_actions: int = 45
    precisions: tuple[str, ...] = ("tf32", "fp32", "bf16")
    steps: int = 200
    repeats: int = 5
    eager: bool = True
    fused_step: bool = True
    """the trainer's fused_step (gper.dqn.Config): fused network forward, loss, Adam"""
    out: Path | None = Path("benchmarks/results")
    seed: int = 0
    rows: list[dict] = field(default_factory=list)


def layer_sizes(obs_dim: int, hidden: tuple[int, ...], n_actions: int) -> list[tuple[int, int]]:
    sizes = [obs_dim, *hidden, n_actions]
    return list(zip(sizes, sizes[1:], strict=False))


def step_flops(obs_dim: int, hidden: tuple[int, ...], n_actions: int, batch: int, double_q: bool = True) -> float:
    """Matmul FLOPs of one training step: online forward (with backward: weight gradients on every
    layer, input gradients on all but the first), target forward, and the online forward on the
    next observations that double-Q needs. Elementwise work is left out (it is bytes, not FLOPs)."""
    layers = layer_sizes(obs_dim, hidden, n_actions)
    macs = sum(i * o for i, o in layers)
    backward = 2 * macs - layers[0][0] * layers[0][1]
    forwards = 3 if double_q else 2
    return 2.0 * batch * (forwards * macs + backward)


def step_bytes(obs_dim: int, hidden: tuple[int, ...], n_actions: int, batch: int, double_q: bool = True) -> float:
    """A lower bound on the step's DRAM traffic in bytes (float32 activations, each written once and
    read once per use): every layer's input read and output written in each forward; the backward
    reads the saved activations and the incoming gradient and writes the outgoing one, about twice
    a forward; plus the sampled rows and the parameters with Adam's two moments."""
    layers = layer_sizes(obs_dim, hidden, n_actions)
    per_forward = sum(4 * batch * (i + 2 * o) for i, o in layers)  # read input, write pre-ReLU, ReLU out
    forwards = 3 if double_q else 2
    params = sum(i * o + o for i, o in layers)
    rows = batch * (2 * obs_dim + 4) * 4
    return forwards * per_forward + 2 * per_forward + rows + params * 4 * 8


def _fill(rb: gper.PrioritizedReplayBuffer, obs_dim: int, n_actions: int, device: torch.device) -> None:
    gen = torch.Generator(device=device).manual_seed(0)
    chunk = 2**20
    left = rb.capacity
    while left > 0:
        n = min(chunk, left)
        rb.add(
            {
                "obs": torch.randn(n, obs_dim, device=device, generator=gen),
                "next_obs": torch.randn(n, obs_dim, device=device, generator=gen),
                "action": torch.randint(0, n_actions, (n,), device=device, generator=gen),
                "reward": torch.randn(n, device=device, generator=gen),
                "done": (torch.rand(n, device=device, generator=gen) < 0.05).float(),
            }
        )
        left -= n
    # spread the priorities as training would (log-uniform TD errors over 5 decades)
    idx = torch.arange(rb.capacity, device=device)
    for lo in range(0, rb.capacity, chunk):
        part = idx[lo : lo + chunk]
        rb.update_priorities(part, torch.pow(10.0, -3 + 5 * torch.rand(part.numel(), device=device, generator=gen)))


def _agent(cfg: TrainBenchConfig, precision: str, rb, graphs: bool, batch_source=None):
    """The trainer's agent with the market preset's learning settings (learning rate, no clipping,
    soft target updates), on the bench's network, batch and replay; it learns only."""
    from gper.dqn import Agent, Config, resolve

    dqn_cfg = resolve(
        Config(
            env="market",
            device=str(cfg.device),
            total_steps=10**9,
            num_envs=1,
            hidden=cfg.hidden,
            buffer_size=cfg.capacity,
            batch_size=cfg.batch,
            learning_starts=cfg.batch,
            epoch_steps=1,
            precision=precision,
            cuda_graphs=graphs,
            fused_step=cfg.fused_step,
            seed=cfg.seed,
        ),
        torch.device("cuda"),  # the GPU preset's settings also when the bench runs on the CPU
    )
    return Agent.for_learning(
        cfg.obs_dim, cfg.n_actions, dqn_cfg, rb, total_train_steps=10**6, batch_source=batch_source
    )


def _fixed_agent(cfg: TrainBenchConfig, precision: str, rb):
    """The same agent fed from one fixed batch of random rows, as wide as the replay's (padded) rows."""
    from gper.dqn import FixedBatch, padded_width

    gen = torch.Generator(device=cfg.device).manual_seed(1)
    width = padded_width(cfg.obs_dim)
    batch = FixedBatch(
        {
            "obs": torch.randn(cfg.batch, width, device=cfg.device, generator=gen),
            "next_obs": torch.randn(cfg.batch, width, device=cfg.device, generator=gen),
            "action": torch.randint(0, cfg.n_actions, (cfg.batch,), device=cfg.device, generator=gen),
            "reward": torch.randn(cfg.batch, device=cfg.device, generator=gen),
            "done": torch.zeros(cfg.batch, device=cfg.device),
        }
    )
    return _agent(cfg, precision, rb, graphs=True, batch_source=lambda: batch)


def run_train_bench(cfg: TrainBenchConfig, log=print) -> list[dict]:
    """Time the training step as the module docstring says; print the table; write the result files."""
    from gper.dqn import padded_width, replay_spec
    from gper.training.timing import PhaseTimer

    device = cfg.device
    env = environment(device)
    log(header_line(env, "bench --train"))
    width = padded_width(cfg.obs_dim)  # what the trainer stores and learns from
    log(
        f"network {cfg.obs_dim} (padded to {width}) -> {' -> '.join(map(str, cfg.hidden))} -> {cfg.n_actions}, "
        f"batch {cfg.batch}, replay {cfg.capacity:,} transitions; filling the replay..."
    )
    rb = gper.PrioritizedReplayBuffer(cfg.capacity, replay_spec(width), device=device, seed=cfg.seed)
    _fill(rb, width, cfg.n_actions, device)
    gflop = step_flops(width, cfg.hidden, cfg.n_actions, cfg.batch) / 1e9
    nbytes = step_bytes(width, cfg.hidden, cfg.n_actions, cfg.batch)
    rows = []
    # on the CPU there are no graphs, CUDA events or datasheet peaks: the rows say what ran
    gpu = device.type == "cuda"
    one, fixed_mode = ("replay, one graph", "fixed batch, one graph") if gpu else ("replay", "fixed batch")
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for precision in cfg.precisions:
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            floor_ms = max(gflop / PEAK_TFLOPS[precision], nbytes / PEAK_TBPS / 1e9) if gpu else None
            agent = _agent(cfg, precision, rb, graphs=True)
            for _ in range(agent.learn.warmup + 2):  # warm up, capture, replay once
                agent.learn.run()
            ms, wall = _time_steps(agent.learn.run, cfg.steps, cfg.repeats, device)
            timer = PhaseTimer(device)
            for _ in range(cfg.steps):
                agent.learn.run(timer)
            synchronize(device)
            phases = {name: m for name, (m, _) in timer.summary().items()}
            fixed = _fixed_agent(cfg, precision, rb)
            for _ in range(fixed.learn.warmup + 2):
                fixed.learn.run()
            fixed_ms, fixed_wall = _time_steps(fixed.learn.run, cfg.steps, cfg.repeats, device)
            base = dict(precision=precision, gflop=round(gflop, 2), floor_ms=round(floor_ms, 4) if gpu else None)

            phase_sum = sum(phases.values())
            overhead = 100 * (ms / fixed_ms - 1)
            row = _timed_row(base, one, ms, wall, phase_sum, floor_ms if gpu else None, replay_overhead_pct=overhead)
            rows.append(row | {f"{k}_ms": v for k, v in phases.items()})
            rows.append(_timed_row(base, fixed_mode, fixed_ms, fixed_wall, fixed_ms, floor_ms if gpu else None))
            x_floor = phase_sum / floor_ms if gpu else None
            by_phase = dict(mode="replay, by phase", ms_per_step=phase_sum, x_floor=x_floor)
            rows.append(base | by_phase)
            if cfg.eager and gpu and precision == cfg.precisions[0]:  # on the CPU every row is eager
                eager = _agent(cfg, precision, rb, graphs=False)
                eager.learn.run()
                e_ms, e_wall = _time_steps(eager.learn.run, max(10, cfg.steps // 4), cfg.repeats, device)
                rows.append(base | dict(mode="replay, eager", ms_per_step=e_ms, wall_ms_per_step=e_wall))
                del eager
            del agent, fixed
            log(f"{precision}: {ms:.3f} ms per step with replay, {fixed_ms:.3f} ms from a fixed batch")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    _report(cfg, env, rows, gflop, nbytes, log)
    return rows


def _timed_row(
    base: dict, mode: str, step_ms: float, wall_ms: float, busy_ms: float, floor_ms: float | None, **extra: float
) -> dict:
    """A row of one timed step: its GPU time, wall time, how busy the GPU was and (on a GPU) the
    ratio to the floor; ``floor_ms`` None on the CPU, where busy and the ratio are not measured."""
    gpu = floor_ms is not None
    busy = dict(busy_pct=100 * busy_ms / wall_ms if gpu else None)
    row = base | dict(mode=mode, ms_per_step=step_ms, wall_ms_per_step=wall_ms) | busy | extra
    return row | dict(x_floor=step_ms / floor_ms if gpu else None)


def _fmt(v, digits: int = 3) -> str:
    if v is None or v == "":
        return ""
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _report(cfg: TrainBenchConfig, env: dict, rows: list[dict], gflop: float, nbytes: float, log) -> None:
    from gper.dqn import padded_width

    gpu = torch.device(cfg.device).type == "cuda"
    headers = ["precision", "mode", f"ms/step ({'GPU' if gpu else 'CPU'})", "ms/step (wall)", "busy %", "replay +%"]
    headers += ["x floor"]
    headers += ["per_sample", "upload", "fwd_bwd", "adam", "learn", "per_update"]
    keys = ["ms_per_step", "wall_ms_per_step", "busy_pct", "replay_overhead_pct", "x_floor"]
    keys += ["per_sample_ms", "upload_ms", "fwd_bwd_ms", "adam_ms", "learn_ms", "per_update_ms"]  # learn: the
    # one-kernel learn step of a network of two hidden layers up to 128 on CUDA, in place of fwd_bwd and adam
    table = [[r["precision"], r["mode"], *(_fmt(r.get(k), 1 if k.endswith("pct") else 3) for k in keys)] for r in rows]
    right = [False, False] + [True] * len(keys)
    print_table(headers, table, right)
    work = f"step work: {gflop:.1f} GFLOP (matmuls) and at least {nbytes / 1e6:.0f} MB of memory traffic"
    floor = work + (
        f"; floor = max(FLOP / dense peak, bytes / {PEAK_TBPS} TB/s) with peaks {PEAK_TFLOPS} TFLOP/s "
        "(H100/H200 SXM datasheet)"
        if gpu
        else f"; on the CPU ({torch.get_num_threads()} torch threads), no floor (it comes from an H100/H200 datasheet)"
    )
    log(floor)
    if cfg.out is None:
        return
    files = ResultFiles(cfg.out, env, COLUMNS, prefix="train-step")
    files.append(rows)
    md = [
        f"# gper bench --train: {env['device']}",
        "",
        header_line(env, "bench --train"),
        "",
        f"Network {cfg.obs_dim} (inputs padded to {padded_width(cfg.obs_dim)} with zeros) -> "
        f"{' -> '.join(map(str, cfg.hidden))} -> {cfg.n_actions} (double-Q, Huber x IS "
        "weights, fused capturable Adam, soft target update, no gradient clipping: the market preset"
        + (
            "; fused_step: hidden layers with a ReLU epilogue, the loss in one kernel, Adam and the soft "
            "update in one kernel per tensor"
            if cfg.fused_step
            else ""
        )
        + "), "
        f"batch {cfg.batch}, replay {cfg.capacity:,} "
        f"transitions, {cfg.steps} steps x {cfg.repeats} repeats, median. Times in ms per training step; "
        + (
            "phase columns from the by-phase run (one graph per phase, CUDA events between, every phase in "
            "turn; the one-graph step runs per_update alongside adam)."
            if gpu
            else "on the CPU: no CUDA graphs, host times; phase columns from the by-phase run."
        ),
        "",
        format_markdown(headers, table, right),
        "",
        floor + ".",
        "",
        (
            "busy % = sum of the GPU phase times / wall time per step (one graph) for the replay rows (over 100 "
            "when phases overlap); GPU time / wall time for the fixed-batch row. "
            if gpu
            else ""
        )
        + "replay +% = (replay step / fixed-batch step - 1), same precision.",
        "",
    ]
    files.write_markdown("\n".join(md))
    log(f"wrote {files.csv_path} and {files.md_path}")

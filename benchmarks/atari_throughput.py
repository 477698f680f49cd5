"""Throughput of DQN on Atari frames: collection alone, learning alone, and both as ``gper train`` runs them.

One :class:`~gper.dqn.pixel_agent.PixelAgent` of the ``atari`` preset (``--num-envs`` games on
ale-py's threads, batch ``--batch-size``, the frame-stack replay, the learn step in CUDA graphs),
filled with ``--fill`` env steps of random play first, then timed for ``--seconds`` each:

| mode | an iteration |
| --- | --- |
| ``collect`` | ``collect_step``: the step sent last collected, added to the replay, the next actions chosen and sent |
| ``learn`` | ``learn_step``: one training step (draw, stacks, forwards, loss, backward, Adam, priorities) |
| ``both`` | ``collect_step`` then ``learn_step``: the trainer's iteration (the games play during the learn step) |

``env_steps_per_s`` counts every game's steps (``agents * num_envs`` an iteration; 0 for ``learn``),
``per_agent`` one agent's (what a population's run counts); ``gpu_share`` is the learn steps' GPU
time (CUDA events around each) over the wall time. ``--populations 1,3`` measures one agent and a
population of 3 (``--population 3``: 3 agents' games in one environment, one learn step for all).

    python benchmarks/atari_throughput.py                  # Pong, 8 games, batch 64, 20 s a mode
    python benchmarks/atari_throughput.py --num-envs 16 --batch-size 128
    python benchmarks/atari_throughput.py --populations 1,2,3 --precision tf32,bf16
    python benchmarks/atari_throughput.py --populations 3 --cudnn-benchmark 0,1

``--cudnn-benchmark 1`` sets ``torch.backends.cudnn.benchmark`` for a row set: cuDNN then times
its convolution algorithms for each shape on first use instead of picking one by heuristics (the
shapes never change here, and the CUDA graphs keep what was chosen). The trainer does not set it.

Writes ``benchmarks/results/atari-throughput-<device>-<stamp>.{csv,md}`` and prints the same table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.dqn import Config
from gper.dqn.build import setup
from gper.training.precision import matmul_precision

COLUMNS = [
    "mode", "game", "agents", "num_envs", "batch", "precision", "cudnn_benchmark", "iterations", "seconds",
    "env_steps_per_s", "per_agent", "learn_per_s", "gpu_share",
]  # fmt: skip


def run_mode(agent, mode: str, seconds: float, cuda: bool) -> dict:
    events: list[tuple] = []
    it, t0 = 0, time.perf_counter()
    step = int(agent.counters[1].item())
    while time.perf_counter() - t0 < seconds:
        if mode != "learn":
            agent.collect_step(None)
        if mode != "collect":
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            step += 1
            agent.learn_step(step, None)
            if cuda:
                end.record()
                events.append((start, end))
        it += 1
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    gpu = sum(s.elapsed_time(e) for s, e in events) / 1e3 if events else 0.0
    n = agent.env.num_envs
    return {
        "iterations": it,
        "seconds": round(wall, 2),
        "env_steps_per_s": round(it * n / wall) if mode != "learn" else 0,
        "per_agent": round(it * n / agent.agents / wall) if mode != "learn" else 0,
        "learn_per_s": round(it / wall) if mode != "collect" else 0,
        "gpu_share": round(gpu / wall, 3) if mode != "collect" else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", default="Pong")
    p.add_argument("--device", default="auto")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--buffer-size", type=int, default=200_000)
    p.add_argument("--fill", type=int, default=20_000, help="env steps of play before the timed modes")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--populations", default="1", help="agents trained together, comma-separated: a row set each")
    p.add_argument("--precision", default="tf32", help="tf32, bf16 or fp32, comma-separated: a row set each")
    p.add_argument("--cudnn-benchmark", default="0", help="0 or 1, comma-separated: a row set each")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    env_info, files, rows = None, None, []
    settings = [
        (int(agents), precision, bool(int(tune)))
        for agents in args.populations.split(",")
        for precision in args.precision.split(",")
        for tune in args.cudnn_benchmark.split(",")
    ]
    for agents, precision, tune in settings:
        cfg = Config(
            env=f"atari:{args.game}", device=args.device, num_envs=args.num_envs, batch_size=args.batch_size,
            buffer_size=args.buffer_size, total_steps=10**7, progress=False, tensorboard=False,
            population=agents, precision=precision,
        )  # fmt: skip
        # as the trainer runs: the precision set while the step is built and its graphs captured
        torch.backends.cudnn.benchmark = tune
        with matmul_precision(precision):
            cfg, agent, _ = setup(cfg, lambda _: None, None)
            device = agent.device
            if env_info is None:
                env_info = environment(device)
                print(header_line(env_info, "atari throughput"))
                files = ResultFiles(Path(args.out), env_info, COLUMNS, prefix="atari-throughput")
            try:
                for _ in range(max(args.fill // args.num_envs, cfg.n_step + 2)):
                    agent.collect_step(None)
                for mode in ("collect", "learn", "both"):
                    row = {"mode": mode, "game": args.game, "agents": agents, "num_envs": args.num_envs}
                    row |= {"batch": args.batch_size, "precision": precision, "cudnn_benchmark": int(tune)}
                    row |= run_mode(agent, mode, args.seconds, device.type == "cuda")
                    rows.append(row)
                    files.append([row])
                    print(
                        f"  {agents} agent(s), {precision}, cudnn benchmark {int(tune)}, {mode}: "
                        f"{row['env_steps_per_s']} env steps/s ({row['per_agent']} an agent), "
                        f"{row['learn_per_s']} learn steps/s", flush=True,
                    )  # fmt: skip
            finally:
                agent.env.close()
                del agent
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    headers = [
        "mode", "game", "agents", "envs an agent", "batch", "precision", "cudnn benchmark", "iterations", "seconds",
        "env steps/s", "an agent's", "learn steps/s", "GPU share",
    ]  # fmt: skip
    table = [["" if r[k] is None else str(r[k]) for k in COLUMNS] for r in rows]
    right = [False, False, True, True, True, False] + [True] * 7
    print()
    print_table(headers, table, right)
    command = shlex.join(sys.argv[1:] if argv is None else argv)
    files.write_markdown(
        "\n".join(
            [
                "# DQN on Atari frames: collection alone, learning alone, both",
                "",
                header_line(env_info, "atari throughput"),
                "",
                f"Command: `python benchmarks/atari_throughput.py {command}`",
                "",
                format_markdown(headers, table, right),
                "",
            ]
        )
    )
    print(f"wrote {files.csv_path} and {files.md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

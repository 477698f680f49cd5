"""Throughput of DQN on Atari frames: collection alone, learning alone, and both as ``gper train`` runs them.

One :class:`~gper.dqn.pixel_agent.PixelAgent` of the ``atari`` preset (``--num-envs`` games on
ale-py's threads, batch ``--batch-size``, the frame-stack replay, the learn step in CUDA graphs),
filled with ``--fill`` env steps of random play first, then timed for ``--seconds`` each:

| mode | an iteration |
| --- | --- |
| ``collect`` | ``collect_step``: the step sent last collected, added to the replay, the next actions chosen and sent |
| ``learn`` | ``learn_step``: one training step (draw, stacks, forwards, loss, backward, Adam, priorities) |
| ``both`` | ``collect_step`` then ``learn_step``: the trainer's iteration (the games play during the learn step) |

``env_steps_per_s`` counts every game's steps (``num_envs`` an iteration; 0 for ``learn``);
``gpu_share`` is the learn steps' GPU time (CUDA events around each) over the wall time.

    python benchmarks/atari_throughput.py                  # Pong, 8 games, batch 64, 20 s a mode
    python benchmarks/atari_throughput.py --num-envs 16 --batch-size 128

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

COLUMNS = ["mode", "game", "num_envs", "batch", "iterations", "seconds", "env_steps_per_s", "learn_per_s", "gpu_share"]


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
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    cfg = Config(
        env=f"atari:{args.game}", device=args.device, num_envs=args.num_envs, batch_size=args.batch_size,
        buffer_size=args.buffer_size, total_steps=10**7, progress=False, tensorboard=False,
    )  # fmt: skip
    cfg, agent, _ = setup(cfg, lambda _: None, None)
    device = agent.device
    env_info = environment(device)
    print(header_line(env_info, "atari throughput"))
    files = ResultFiles(Path(args.out), env_info, COLUMNS, prefix="atari-throughput")
    rows = []
    try:
        for _ in range(max(args.fill // args.num_envs, cfg.n_step + 2)):
            agent.collect_step(None)
        for mode in ("collect", "learn", "both"):
            row = {"mode": mode, "game": args.game, "num_envs": args.num_envs, "batch": args.batch_size}
            row |= run_mode(agent, mode, args.seconds, device.type == "cuda")
            rows.append(row)
            files.append([row])
            print(f"  {mode}: {row['env_steps_per_s']} env steps/s, {row['learn_per_s']} learn steps/s", flush=True)
    finally:
        agent.env.close()
    headers = ["mode", "game", "envs", "batch", "iterations", "seconds", "env steps/s", "learn steps/s", "GPU share"]
    table = [["" if r[k] is None else str(r[k]) for k in COLUMNS] for r in rows]
    right = [False, False] + [True] * 7
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

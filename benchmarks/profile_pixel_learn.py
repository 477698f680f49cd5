"""Where does the pixel learner's GPU time go? Per-kernel time (torch.profiler) of the learn step
and of the collect step of ``atari:<Game>``, for one agent and for populations.

Developer tool (a profile, not a timing table): the learn step runs without CUDA graphs here so
each kernel shows by name; its kernels' durations are those a graph replays.

    python benchmarks/profile_pixel_learn.py --populations 1,3 --precision tf32,bf16

Prints, for each setting, the kernels a step launches, their summed GPU time a step and the 20
costliest, and writes the same to ``<out>/pixel-learn-profile-<stamp>.txt``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gper.bench.report import environment, header_line
from gper.dqn import Config
from gper.dqn.build import setup
from gper.training.precision import matmul_precision


def profiled(step, steps: int, cuda: bool) -> tuple[str, int, float]:
    """The kernel table of ``steps`` calls of ``step``, kernels a call and GPU ms a call."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(5):
        step()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        sync()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.device_time for e in events) / 1e3 / steps
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)
    return table, len(events) // steps, gpu_ms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", default="Pong")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--populations", default="1,3")
    p.add_argument("--precision", default="tf32")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--device", default="cuda", help="cuda (cpu: a smoke run of the script, no kernel table)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    lines: list[str] = []
    for agents in (int(x) for x in args.populations.split(",")):
        for precision in args.precision.split(","):
            cfg = Config(
                env=f"atari:{args.game}", device=args.device, num_envs=args.num_envs, batch_size=args.batch_size,
                buffer_size=50_000, total_steps=10**7, progress=False, tensorboard=False, population=agents,
                precision=precision, cuda_graphs=False,
            )  # fmt: skip
            # as the trainer runs: the precision set while the step is built and its graphs captured
            with matmul_precision(precision):
                cfg, agent, _ = setup(cfg, lambda _: None, None)
                if not lines:
                    lines.append(header_line(environment(agent.device), "pixel learn profile"))
                try:
                    for _ in range(2_000 // args.num_envs):
                        agent.collect_step(None)
                    count = [0]

                    def learn(agent=agent, count=count):
                        count[0] += 1
                        agent.learn_step(count[0], None)

                    for what, step in (("learn", learn), ("collect", lambda agent=agent: agent.collect_step(None))):
                        table, kernels, gpu_ms = profiled(step, args.steps, agent.device.type == "cuda")
                        lines.append(
                            f"== {what} step, {agents} agent(s), {precision}, batch {args.batch_size}: "
                            f"{kernels} kernels a step, {gpu_ms:.3f} ms of kernel time a step"
                        )
                        lines.append(table)
                        print(lines[-2], flush=True)
                finally:
                    agent.env.close()
                    del agent
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"pixel-learn-profile-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.txt"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

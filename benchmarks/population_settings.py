"""The population's iteration at other settings than the cartpole preset's, and the fused learn kernel's shapes.

``gper bench train-step --population`` times the cartpole preset (a 256-256 network, batch 256, 4
environments an agent). This script times the same iteration (the same bench,
:func:`gper.bench.population_step.run_population_bench`) at named settings:

* ``preset-128``: the preset with a (128, 128) network, which the one-kernel learn step
  (:mod:`gper.dqn.population_fused_learn`) holds;
* ``purejaxrl``: PureJaxRL's DQN settings as ``gper bench trainers`` runs gper at them (10
  environments, a (120, 84) network, batch 128, uniform replay, no double-Q, no clipping, the
  squared-error loss).

With ``--kernel`` it also times the learn kernel alone (CUDA events, median of repeats) for each
chunk size and warp count, at the settings' shapes, to pick the defaults. Writes the bench's files
and ``fused-learn-kernel-<device>-<stamp>.md`` under ``--out``.

Usage: python benchmarks/population_settings.py --settings preset-128 purejaxrl --agents 1 16 64 256 --kernel
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch

from gper.bench.population_step import PopulationBenchConfig, run_population_bench
from gper.bench.report import ResultFiles, environment, format_markdown, header_line
from gper.bench.timing import time_graph

SETTINGS = {
    "preset": {},
    "preset-128": {"hidden": (128, 128)},
    "purejaxrl": {
        "num_envs": 10, "hidden": (120, 84), "batch_size": 128, "buffer_size": 10_000, "sampling": "uniform",
        "double_q": False, "max_grad_norm": 0.0, "target_every": 50, "loss": "mse",
    },
}  # fmt: skip


#: learn steps in each timed graph
GRAPH_CALLS = 20
#: (rows, warps) variants of the learn kernel's gradient programs; the others are checked against the first
KERNEL_VARIANTS = ((32, 8), (32, 4), (64, 4), (64, 8), (128, 4), (128, 8), (128, 16))


def kernel_sweep(device: torch.device, agents: list[int], out: Path) -> None:
    """Time population_learn_step alone at each setting's shapes, chunk size and warp count, replayed
    from a CUDA graph of 20 calls (:func:`gper.bench.timing.time_graph`), and check each variant's first step against
    the default's from the same state (TD errors and parameters)."""
    import gper.dqn.population_fused_learn as fl
    from gper.dqn.population_adam import PopulationAdam
    from gper.dqn.population_net import stacked_init

    rows = []
    default = KERNEL_VARIANTS[0]
    shapes = {
        "preset-128": ((128, 128), 256, True, 10.0, "huber"),
        "purejaxrl": ((120, 84), 128, False, 0.0, "mse"),
    }
    for name, (hidden, batch, double_q, clip, loss) in shapes.items():
        for n in agents:
            g = torch.Generator(device=device).manual_seed(n)
            rows_w = torch.randn(n, batch, 2, 4, device=device, generator=g)
            x, nx = rows_w[:, :, 0], rows_w[:, :, 1]
            action = torch.randint(0, 2, (n, batch), device=device, generator=g)
            reward, done = torch.randn(n, batch, device=device, generator=g), torch.zeros(n, batch, device=device)
            weights = torch.rand(n, batch, device=device, generator=g) + 0.5
            reference = None
            for block, warps in KERNEL_VARIANTS:
                torch.manual_seed(0)
                online = stacked_init(list(range(n)), 4, 2, hidden, device=device)
                target = online.detached_copy()
                adam = PopulationAdam(list(online.parameters()), lr=1e-3, capturable=True, backend="triton")
                td = torch.zeros(n, batch, device=device)
                sums = torch.zeros(n, 3, dtype=torch.float64, device=device)
                step = functools.partial(
                    fl.population_learn_step,
                    list(online.parameters()), list(target.parameters()), adam.exp_avgs, adam.exp_avg_sqs,
                    adam.steps, adam.device_lr, x, nx, action, reward, done, weights, sums, td,
                    gamma=0.99, double_q=double_q, max_grad_norm=clip, soft_tau=None, precision="tf32", loss=loss,
                    rows=block, num_warps=warps,
                )  # fmt: skip
                try:
                    step()
                except Exception as exc:  # a variant that does not compile (shared memory, say)
                    rows.append([name, str(n), str(block), str(warps), type(exc).__name__, "-"])
                    print(*rows[-1], flush=True)
                    continue
                state = [td.clone(), *[p.detach().clone() for p in online.parameters()]]
                if reference is None:
                    reference, diff = state, 0.0
                else:
                    diff = max(float((a - b).abs().max()) for a, b in zip(state, reference, strict=True))
                # a graph of GRAPH_CALLS calls: its launch is a share of each call's time, not all of it
                timing = time_graph(lambda step=step: [step() for _ in range(GRAPH_CALLS)], repeats=9)
                us = timing.median_us / GRAPH_CALLS
                rows.append([name, str(n), str(block), str(warps), f"{us:,.1f}", f"{diff:.1e}"])
                print(*rows[-1], flush=True)
    env = environment(device)
    md = [f"# The fused learn kernel alone: {env['device']}", "", header_line(env, "population_settings --kernel"), ""]
    md += [
        "population_learn_step replayed from a CUDA graph of 20 calls (gper.bench.timing.time_graph), µs a call, "
        "median of 9 repeats; "
        f"max abs diff: the largest difference of the first step's TD errors and parameters from the "
        f"{default[0]}-row, {default[1]}-warp variant's, from the same state; the rule in gper "
        f"(population_fused_learn.block_rows) picks {fl.BLOCK_B} rows, or {fl.BLOCK_B_WIDE} once "
        "that grid fills every multiprocessor",
        "",
    ]
    headers = ["settings", "agents", "rows", "warps", "µs", "max abs diff"]
    md += [format_markdown(headers, rows, [False, True, True, True, True, True])]
    files = ResultFiles(out, env, None, prefix="fused-learn-kernel")
    files.write_markdown("\n".join(md) + "\n")
    print(f"wrote {files.md_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="*", default=["preset-128", "purejaxrl"], choices=sorted(SETTINGS))
    parser.add_argument("--agents", nargs="+", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--kernel", action="store_true", help="also time the fused learn kernel's variants")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.kernel and device.type == "cuda":
        kernel_sweep(device, args.agents, args.out)
    for name in args.settings:
        print(f"== settings {name}: {SETTINGS[name]}", flush=True)
        run_population_bench(
            PopulationBenchConfig(device=device, agents=tuple(args.agents), out=args.out, overrides=SETTINGS[name])
        )


if __name__ == "__main__":
    main()

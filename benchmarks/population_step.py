"""One training iteration (collect + learn) of a population of N DQN agents against one agent.

For N in ``--agents`` (default 1 16 64 256): a :class:`gper.dqn.population_agent.PopulationAgent`
on the cartpole preset (4 environments, 256-256 network, batch 256, PER) with its collect and
learn steps in CUDA graphs, warmed past learning_starts; then the device and wall time of
``--steps`` iterations (median of repeats, :func:`gper.bench.timing.time_steps`). The single agent
(:class:`gper.dqn.Agent`, ``gper train``'s) is timed the same way as the baseline. Prints a table
headed by the GPU, versions and commit, and writes it under ``--out``.

    python benchmarks/population_step.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import time_steps
from gper.dqn import Config
from gper.dqn.build import setup
from gper.dqn.config import resolve
from gper.dqn.population_agent import PopulationAgent
from gper.dqn.sweep import agent_configs


def iteration(agent) -> callable:
    step = [0]

    def run() -> None:
        agent.collect_step(None)
        step[0] += 1
        agent.learn_step(step[0], None)

    return run


def timed(agent, steps: int) -> tuple[float, float]:
    run = iteration(agent)
    for _ in range(20):  # past the graphs' warm-up and capture
        run()
    return time_steps(run, steps, 5, agent.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    device = torch.device("cuda")
    env = environment(device)
    config = Config(env="cartpole", device="cuda", save=False, learning_starts=256)
    cfg, single, _ = setup(config, log=lambda *a: None)
    for _ in range(cfg.batch_size):  # enough transitions for a batch
        single.collect_step(None)
    base_gpu, base_wall = timed(single, args.steps)
    rows = [["single Agent", "1", f"{base_gpu * 1e3:.0f}", f"{base_wall * 1e3:.0f}", "1.00", "-"]]
    for n in args.agents:
        pop = PopulationAgent(agent_configs(resolve(config, device), n), device, 10**6)
        for _ in range(cfg.batch_size):
            pop.collect_step(None)
        gpu, wall = timed(pop, args.steps)
        sps = n * cfg.num_envs / (wall * 1e-3)
        rows.append(
            ["population", str(n), f"{gpu * 1e3:.0f}", f"{wall * 1e3:.0f}", f"{wall / base_wall:.2f}", f"{sps:,.0f}"]
        )
        del pop
        torch.cuda.empty_cache()
    headers = ["learner", "agents", "device µs / iteration", "wall µs / iteration", "× single (wall)", "env steps/s"]
    right = [False, True, True, True, True, True]
    title = (
        f"cartpole preset ({cfg.num_envs} envs, {cfg.hidden}, batch {cfg.batch_size}, {cfg.sampling}): "
        "one collect + one learn step, CUDA graphs"
    )
    print(header_line(env, "population step"))
    print_table(headers, rows, right, title)
    files = ResultFiles(args.out, env, None, prefix="population-step")
    table = format_markdown(headers, rows, right)
    files.write_markdown(f"{header_line(env, 'population step')}\n\n{title}\n\n{table}\n")
    print(f"wrote {files.path('.md')}")


if __name__ == "__main__":
    main()

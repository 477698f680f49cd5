"""The host's share of a population's epoch: the epoch report's time per finished episode and the
end-of-run plot, on the CPU, through the public calls the trainer makes.

A population that finishes many short episodes (early in training) spends each epoch's end on the
host while the GPU waits: the drain of the episode ring, one ``metrics.jsonl`` record an episode,
each agent's 100-episode windows (``gper bench trainers``' log at 256 agents: the GPU busy 31% of
epochs that finished about 100k episodes). This times :meth:`PopulationReport.drain` and
:meth:`~gper.training.report.RunReport.end_epoch` on synthetic epochs (random returns, steps and
agents, ``--episodes`` an epoch) and :func:`gper.training.plot.figure` on ``--agents`` x
``--plot-episodes`` episode records, one torch thread. Run it on two checkouts to compare them:
``PYTHONPATH=<checkout>/src python benchmarks/population_report_host.py --label <name>``; it writes
``population-report-host-<device>-<stamp>-<label>.md``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gper.bench.report import ResultFiles, environment, format_markdown, header_line
from gper.training import plot
from gper.training.episodes import EpisodeTracker
from gper.training.population_report import PopulationReport
from gper.training.runlog import RunLog
from gper.training.settings import RunConfig


def report_us(agents: int, episodes: int, epochs: int) -> float:
    """µs an episode of drain + end_epoch, the median over ``epochs`` epochs."""
    rng = np.random.default_rng(0)
    tracker = EpisodeTracker(agents * 10, torch.device("cpu"), agents=agents)
    with tempfile.TemporaryDirectory() as folder:
        log = RunLog(folder)
        cfg = RunConfig(env="synthetic", num_envs=10, solve_return=475.0)
        report = PopulationReport(cfg, torch.device("cpu"), log, [], lambda line: None, agents=agents)
        sums = torch.zeros(agents, 3, dtype=torch.float64)
        report.start(time.perf_counter(), sums.clone(), 0)
        times, count = [], 0
        for epoch in range(epochs):
            step = np.sort(rng.integers(epoch * 10_000, (epoch + 1) * 10_000, episodes)) // 10 * 10
            ret = rng.integers(8, 60, episodes).astype(np.float64)
            rows = np.stack([ret, ret, step, rng.integers(0, agents, episodes)], 1)
            # where the device would have written them: the ring's next rows
            tracker.table[torch.arange(count, count + episodes) % tracker.ring] = torch.from_numpy(rows)
            count += episodes
            host = {"sums": sums, "episodes": tracker.table, "episode_count": torch.tensor(count)}
            start = time.perf_counter()
            drained, lost = report.drain(tracker, host)
            report.end_epoch(
                host, drained, lost, env_step=(epoch + 1) * 10_000, iterations=1000, train_steps=0,
                charts={}, phases={}, now=time.perf_counter(),
            )  # fmt: skip
            times.append((time.perf_counter() - start) / episodes * 1e6)
        log.close()
    return statistics.median(times)


def plot_s(agents: int, episodes: int) -> float:
    """Seconds of plot.figure on a population's record of ``agents`` x ``episodes`` episodes."""
    random.seed(0)
    rows = []
    for k in range(agents * episodes):
        a, step = k % agents, (k // agents) * 100 + 10
        rows.append({"global_step": step, f"agent_{a}/charts/episodic_return": float(random.randint(8, 500)),
                     f"agent_{a}/charts/episodic_length": 20})  # fmt: skip
        if k % (agents * 80) == agents * 80 - 1:
            epoch = {"global_step": step, "charts/SPS": 1e6, "losses/td_loss": 0.5, "timing/learn_ms": 0.2}
            rows.append(epoch | {f"agent_{i}/charts/mean_return_last100": 1.0 for i in range(agents)})
    start = time.perf_counter()
    plot.figure(rows, "synthetic", 475.0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=256)
    parser.add_argument("--episodes", type=int, default=100_000, help="episodes an epoch")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--plot-episodes", type=int, default=4000, help="episodes an agent in the plotted record")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    us = report_us(args.agents, args.episodes, args.epochs)
    seconds = plot_s(args.agents, args.plot_episodes)
    env = environment(torch.device("cpu"))
    rows = [
        [f"epoch report (drain + end_epoch), {args.agents} agents, {args.episodes:,} episodes an epoch",
         f"{us:.2f} µs an episode (median of {args.epochs} epochs)"],
        [f"plot.figure, {args.agents} agents x {args.plot_episodes:,} episodes", f"{seconds:.2f} s"],
    ]  # fmt: skip
    print(*(" | ".join(r) for r in rows), sep="\n")
    md = [f"# A population's host work at the epoch's end and the run's end: {env['device']}", ""]
    md += [header_line(env, f"population_report_host {args.label}".strip()), "", "one torch thread", ""]
    md += [format_markdown(["what", "time"], rows, [False, True])]
    files = ResultFiles(args.out, env, None, prefix="population-report-host")
    path = files.path(f"-{args.label}.md" if args.label else ".md")
    path.write_text("\n".join(md) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

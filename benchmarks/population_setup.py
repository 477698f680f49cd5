"""Where a population's run spends its time outside the graphed iterations, at PureJaxRL's settings.

``gper bench trainers`` reports, for gper, the ``train()`` call's time outside its training loop
(``compile/setup``) and the loop's wall time. This script runs the same settings
(:func:`gper.bench.trainers.gper_run.purejaxrl_settings`) for each population size twice in one
process, which starts with an empty Triton cache (``TRITON_CACHE_DIR`` set to a new folder before
Triton is imported): the first population size's first run compiles every kernel it uses, a later
size's first run only the variants it adds (64 batch rows a gradient program, say), and each
second run none; then once more without the phase timing (``time_every=0``), to show what timing
every tenth iteration costs. Each run is ``--steps`` env steps an agent (training from step
10,000). Prints one row a run and writes ``population-setup-<device>-<stamp>.md``.

Usage: python benchmarks/population_setup.py --agents 64 256 --steps 100000 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="gper-triton-cache-"))

import torch  # noqa: E402

from gper.bench.report import ResultFiles, environment, format_markdown, header_line  # noqa: E402
from gper.bench.trainers.gper_run import QUIET, purejaxrl_settings  # noqa: E402
from gper.bench.trainers.purejaxrl_run import default_config  # noqa: E402
from gper.dqn import Config, train  # noqa: E402

#: each population size's runs, in this order: (label, Config changes)
RUNS = (("first (compiles what is new)", {}), ("second (cache warm)", {}), ("time_every=0", {"time_every": 0}))


def one_run(agents: int, steps: int, device: str, **changes) -> list[str]:
    fields = purejaxrl_settings(default_config()) | QUIET | {"device": device, "seed": 1, "total_steps": steps}
    fields |= {"population": agents} if agents > 1 else {}
    with tempfile.TemporaryDirectory(prefix="gper-setup-") as run_dir:
        t0 = time.perf_counter()
        res = train(Config(**fields, **changes, run_dir=run_dir), log=lambda line: None)
        call = time.perf_counter() - t0
    iterations = steps // fields["num_envs"]
    return [f"{call - res.wall_s:.1f}", f"{res.wall_s:.2f}", f"{res.wall_s / iterations * 1e6:.0f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for n in args.agents:
        for label, changes in RUNS:
            row = [str(n), label, *one_run(n, args.steps, args.device, **changes)]
            print(*row, flush=True)
            rows.append(row)
    env = environment(device)
    title = f"# A population's setup and loop at PureJaxRL's settings: {env['device']}"
    md = [title, "", header_line(env, "population_setup"), ""]
    md += [
        f"train() at gper bench trainers' PureJaxRL settings, {args.steps:,} env steps an agent, runs in this order "
        f"in one process; Triton's cache started empty ({os.environ['TRITON_CACHE_DIR']}) before the first size's "
        "first run; setup = the call's time "
        "outside its training loop; µs/iteration = loop wall / collection iterations (the first 1,000 collect only)",
        "",
    ]
    headers = ["agents", "run", "setup s", "loop s", "µs/iteration"]
    md += [format_markdown(headers, rows, [True, False, True, True, True])]
    files = ResultFiles(args.out, env, None, prefix="population-setup")
    files.write_markdown("\n".join(md) + "\n")
    print(f"wrote {files.md_path}")


if __name__ == "__main__":
    main()

"""Do two runs of the same settings compute the same thing when other processes share the GPU?

Each of ``--processes`` worker processes loops for ``--seconds``: a short ``gper train`` run
(``whole``), a second run of the same settings (``whole2``) and a run resumed from ``whole``'s
checkpoint at ``--resume-at`` env steps (``resumed``), each writing a checkpoint every epoch. It
compares ``whole2`` and ``resumed`` with ``whole`` checkpoint by checkpoint and records the first
env step where one differs and what differs there (networks, Adam's state, the environment, the
episodes, the replay, the random generators; ``[n]``: elements that differ). The buffer's beta
scalar is left out: it is scratch that every call writes before a kernel reads it.

The settings are the GPU resume test's (``tests/dqn/test_nstep.py``): cartpole, 1,000 env steps,
learning from 200, epochs of 200, a network of 16 units, batch 32; each variant changes a few
(``VARIANTS``), and ``cublas`` variants start their workers with
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (PyTorch's setting for deterministic cuBLAS), the others with
it empty. The workers of a variant run at once, so they share the GPU.

    python benchmarks/determinism_stress.py                                   # every variant, 8 x 30 s each
    python benchmarks/determinism_stress.py --variants plain cublas --seconds 60
    python benchmarks/determinism_stress.py --device cpu --processes 1 --seconds 0 --total-steps 400

Writes ``benchmarks/results/determinism-stress-<device>-<stamp>.{csv,md}`` and prints the same table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table

COLUMNS = ["variant", "settings", "cublas_workspace", "runs", "whole2_differ", "resumed_differ"]
COLUMNS += ["first_steps", "first_keys"]
#: name -> (settings changed from the test's, CUBLAS_WORKSPACE_CONFIG)
VARIANTS: dict[str, tuple[dict, str]] = {
    "plain": ({}, ""),
    "cublas": ({}, ":4096:8"),
    # every action random: the collect step never reads the network
    "cublas-random-actions": ({"eps_start": 1.0, "eps_end": 1.0}, ":4096:8"),
    "cublas-fp32": ({"precision": "fp32"}, ":4096:8"),
    "cublas-no-graphs": ({"cuda_graphs": False}, ":4096:8"),
    "cublas-plain-step": ({"fused_step": False}, ":4096:8"),
    "cublas-torch-kernels": ({"backend": "torch"}, ":4096:8"),
    "cublas-flat-replay": ({"n_step": 1}, ":4096:8"),
}
TEST_SETTINGS = dict(
    env="cartpole", total_steps=1000, learning_starts=200, batch_size=32, buffer_size=1000, epoch_steps=200,
    hidden=(16,), progress=False, tensorboard=False, checkpoint_every=1, keep_checkpoints=10, n_step=3,
)  # fmt: skip


def flatten(value: object, prefix: str = "") -> dict[str, object]:
    """Nested dicts and lists as one dict keyed by dotted paths."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)) and not prefix.startswith("returns"):
        items = enumerate(value)
    else:
        return {prefix[:-1]: value}
    out: dict[str, object] = {}
    for k, v in items:
        out |= flatten(v, f"{prefix}{k}.")
    return out


def computed(checkpoint: Path) -> dict[str, object]:
    """What a checkpoint holds that the run computed: every tensor (the replay's as ``replay.<name>``,
    its scalars without beta), the episode returns, the iteration and the replay's counts."""
    from safetensors.torch import load_file

    from gper.ops.state import S_MAXP

    trainer = torch.load(checkpoint / "trainer.pt", map_location="cpu", weights_only=True)
    out = {k: v for k, v in flatten(trainer).items() if isinstance(v, torch.Tensor)}
    out |= {k: trainer[k] for k in ("returns", "iteration", "replay_counts")}
    replay = load_file(checkpoint / "replay.safetensors")
    replay["scalars"] = replay["scalars"][S_MAXP]  # beta is scratch (see the module docstring)
    return out | {f"replay.{k}": v for k, v in replay.items()}


def differences(a: dict[str, object], b: dict[str, object]) -> list[str]:
    """The keys whose values differ (``key[n]``: n elements of a tensor; ``key[shape]``: other shapes)."""
    out = []
    for key in sorted(a.keys() | b.keys()):
        x, y = a.get(key), b.get(key)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                out.append(f"{key}[shape]")
            elif not torch.equal(x, y):
                out.append(f"{key}[{int((x != y).sum())}]")
        elif x != y:
            out.append(key)
    return out


def first_difference(run: Path, other: Path) -> tuple[int, list[str]] | None:
    """(env step, what differs) at the first checkpoint both runs wrote that differs; None if none does."""
    from gper.training.checkpoints import list_checkpoints

    for path in list_checkpoints(run / "checkpoints"):
        twin = other / "checkpoints" / path.name
        if twin.exists():
            diff = differences(computed(path), computed(twin))
            if diff:
                return int(path.name.split("-")[1]), diff
    return None


def worker(args: argparse.Namespace) -> None:
    """Loop whole / whole2 / resumed for ``args.seconds`` (at least once); a JSON line per loop."""
    from gper.dqn import Config, train

    changed, _ = VARIANTS[args.worker]
    quiet = dict(log=lambda _: None)
    t0 = time.perf_counter()
    while True:
        with tempfile.TemporaryDirectory() as tmp:
            settings = TEST_SETTINGS | dict(device=args.device, total_steps=args.total_steps, run_dir=tmp) | changed
            train(Config(**settings, run_name="whole"), **quiet)
            train(Config(**settings, run_name="whole2"), **quiet)
            middle = Path(tmp) / "whole" / "checkpoints" / f"step-{args.resume_at:012d}"
            train(Config(**settings, run_name="resumed", resume=str(middle)), **quiet)
            result = {name: first_difference(Path(tmp) / "whole", Path(tmp) / name) for name in ("whole2", "resumed")}
        print(json.dumps(result), flush=True)
        if time.perf_counter() - t0 >= args.seconds:
            return


def run_variant(name: str, args: argparse.Namespace) -> dict[str, object]:
    """The variant's workers at once; their loops summed into a row."""
    changed, cublas = VARIANTS[name]
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=cublas)
    command = [sys.executable, __file__, "--worker", name, "--device", args.device, "--seconds", str(args.seconds)]
    command += ["--total-steps", str(args.total_steps), "--resume-at", str(args.resume_at)]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(args.processes)]
    loops = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a worker of {name} failed (exit {p.returncode}); its output:\n{out}")
        loops += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    firsts = [tuple(r[k]) for r in loops for k in ("whole2", "resumed") if r[k] is not None]
    steps = Counter(step for step, _ in firsts)
    keys = Counter(" ".join(diff[:3]) for _, diff in firsts)
    return {
        "variant": name,
        "settings": " ".join(f"{k}={v}" for k, v in changed.items()) or "the test's",
        "cublas_workspace": cublas or "unset",
        "runs": len(loops),
        "whole2_differ": sum(r["whole2"] is not None for r in loops),
        "resumed_differ": sum(r["resumed"] is not None for r in loops),
        "first_steps": ", ".join(f"{s}: {n}" for s, n in sorted(steps.items())),
        "first_keys": "; ".join(f"{k} ({n})" for k, n in keys.most_common(3)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--processes", type=int, default=8, help="workers of a variant, run at once")
    p.add_argument("--seconds", type=float, default=30.0, help="each worker's loops start until this many seconds")
    p.add_argument("--total-steps", type=int, default=1000)
    p.add_argument("--resume-at", type=int, default=400, help="env steps of the checkpoint resumed (a multiple of 200)")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--worker", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.processes < 1 or args.seconds < 0:
        p.error("--processes must be at least 1 and --seconds at least 0")
    if args.resume_at % TEST_SETTINGS["epoch_steps"] or not 0 < args.resume_at < args.total_steps:
        p.error(f"--resume-at must be a multiple of {TEST_SETTINGS['epoch_steps']} below --total-steps")
    if args.worker:
        worker(args)
        return 0
    env_info = environment(torch.device(args.device))
    print(header_line(env_info, "determinism stress"))
    files = ResultFiles(Path(args.out), env_info, COLUMNS, prefix="determinism-stress")
    rows = []
    for name in args.variants:
        t0 = time.perf_counter()
        rows.append(run_variant(name, args))
        files.append(rows[-1:])
        r = rows[-1]
        print(f"  {name}: {r['runs']} runs, whole2 differed {r['whole2_differ']}, resumed {r['resumed_differ']} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    table = [[str(r[c]) for c in COLUMNS] for r in rows]
    right = [c in ("runs", "whole2_differ", "resumed_differ") for c in COLUMNS]
    print_table(COLUMNS, table, right)
    command = " ".join(shlex.quote(a) for a in ["python", "benchmarks/determinism_stress.py", *sys.argv[1:]])
    intro = (
        f"{args.processes} processes a variant at once, each looping for {args.seconds:g} s: a run of "
        f"{args.total_steps} env steps, a second run, and a run resumed at {args.resume_at}; "
        "runs: loops; *_differ: loops whose second or resumed run differed from the first at a checkpoint; "
        "first_steps: the env steps of those first differences; first_keys: their first three keys."
    )
    head = f"# Determinism under a shared device\n\n{header_line(env_info, 'determinism stress')}\n\n"
    text = f"{head}Command: `{command}`\n\n{intro}\n\n{format_markdown(COLUMNS, table, right)}\n"
    files.write_markdown(text)
    print(f"wrote {files.csv_path} and {files.md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The command line of ``gper bench``: its subcommands and ``main`` (each subcommand in :mod:`gper.bench.commands`).

Examples::

    gper bench replay               # gper vs the O(N) baselines (GPU: 2^16..2^25, batches 256..16384)
    gper bench replay --quick       # a smoke run
    gper bench replay --capacities 20 25 --batches 16384 --impls gper cumsum --no-graph
    gper bench peers --device cpu --threads 1           # gper vs TorchRL, cpprb, flashbax
    gper bench exactness --peers gper cpprb --budget-s 60
    gper bench train-step           # the DQN training step with replay vs from a fixed batch
    gper bench checkpoint           # save() / load() of a full 2^25 buffer: seconds and host memory
    gper bench trajectory           # the trajectory buffer beside the flat one: 1-/3-step samples, add, sequences
    gper bench trainers             # PureJaxRL's DQN (1..256 seeds in one vmap) beside gper train on CartPole-v1

Each subcommand's flags, settings and run are in :mod:`gper.bench.commands`.
``gper bench [flags]`` is ``gper bench replay [flags]``, and ``gper bench --train [flags]`` is
``gper bench train-step [flags]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from gper.bench.commands import checkpoint, exactness, peers, replay, train_step, trainers, trajectory

#: subcommand -> one-line help
SUBCOMMANDS = {
    "replay": "time sample / update / add / step against the O(N) cumsum baseline and torch.multinomial",
    "peers": "time gper against TorchRL, cpprb, flashbax and the O(N) baselines on the reference workload",
    "exactness": "check each peer's sampler: every slot reachable, a 1e-6 leaf, 8 distinct leaves",
    "train-step": "time the DQN training step with replay against the same step from a fixed batch",
    "checkpoint": "time save() and load() of a full buffer, and the host memory they need, against torch.save",
    "trajectory": "time the trajectory buffer's 1-/3-step samples, steps, add and sequences beside the flat buffer's",
    "trainers": "time whole DQN runs on CartPole-v1 to a 100-episode mean of 475: PureJaxRL's (N seeds in one vmap) "
    "beside gper train's",
}

#: subcommand -> (add its flags to a parser, run it from the parsed flags)
_PARTS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "replay": (replay.add_replay_arguments, replay.run_replay),
    "peers": (peers.add_peers_arguments, peers.run_peers),
    "exactness": (exactness.add_exactness_arguments, exactness.run_exactness),
    "train-step": (train_step.add_train_arguments, train_step.run_train),
    "checkpoint": (checkpoint.add_checkpoint_arguments, checkpoint.run_checkpoint),
    "trajectory": (trajectory.add_trajectory_arguments, trajectory.run_trajectory),
    "trainers": (trainers.add_trainers_arguments, trainers.run_trainers),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gper bench",
        description="Benchmarks of gper. Without a subcommand, `gper bench [flags]` runs `gper bench replay "
        "[flags]`, and `gper bench --train [flags]` runs `gper bench train-step [flags]`.",
    )
    sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for name, help_text in SUBCOMMANDS.items():
        add, run = _PARTS[name]
        p = sub.add_parser(name, help=help_text, description=f"gper bench {name}: {help_text}")
        add(p)
        p.set_defaults(_run=run)
    return parser


def resolve_aliases(argv: list[str]) -> list[str]:
    """``[flags]`` -> ``["replay", *flags]``; ``["--train", *flags]`` -> ``["train-step", *flags]``."""
    if argv and (argv[0] in SUBCOMMANDS or argv[0] in ("-h", "--help")):
        return argv
    if "--train" in argv:
        return ["train-step", *(a for a in argv if a != "--train")]
    return ["replay", *argv]


def main(argv: list[str]) -> int:
    """Run ``gper bench`` with the rest of the command line; the subcommand's exit status."""
    args = build_parser().parse_args(resolve_aliases(list(argv)))
    args.command_line = " ".join(["gper", "bench", *argv])
    if getattr(args, "out", None):  # say where the files go before the (long) run starts
        print(f"gper bench: result files go to {Path(args.out).resolve()} (--out DIR to change)", flush=True)
    return int(args._run(args) or 0)

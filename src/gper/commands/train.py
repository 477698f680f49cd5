"""``gper train``: the command line of :func:`gper.dqn.train` and of walk-forward runs
(:func:`gper.walkforward.walk_forward`, for the market's window flags ``--train-months`` ...), made
by tyro from :class:`gper.dqn.Config` (each field's docstring is its ``--help`` text).

    gper train                                  # cartpole, GPU if there is one
    gper train --env market --total-steps 1000000
    gper train --env gym:LunarLander-v3 --seed 2
    gper train --resume runs/cartpole__s1__20261129-120000 --total-steps 400000
    gper train --env market --data arch:sp500 --train-months 36 --val-months 12 --test-months 12
    torchrun --nproc-per-node 8 -m gper train --env market   # data-parallel: docs/distributed.md

With ``--resume``, the flags not given keep the checkpoint's settings
(:func:`gper.dqn.stored_config`). After SIGINT the command writes a checkpoint and
exits with status 130; after SIGTERM, with 143.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

from gper.dqn.algorithm import stored_config, train
from gper.dqn.config import Config, pick_device, walk_spec
from gper.dqn.help import command_config, from_config, presets_table, to_config
from gper.training import parallel
from gper.training.extras import MissingExtra, require
from gper.training.parallel import PeerFailed
from gper.walkforward.run import resume_config, walk_forward


def main(argv: list[str]) -> int:
    """Parse ``argv`` (the flags after ``gper train``), run a plain training run (:func:`gper.dqn.train`)
    or, when the market's window flags are given, walk-forward folds (:func:`gper.walkforward.walk_forward`),
    print the summary; the exit status."""
    try:
        tyro = require("tyro")
    except MissingExtra as err:
        print(err, file=sys.stderr)
        return 2
    default = None
    early = _early_flags(argv)
    if early.resume is not None:  # the checkpoint's settings are the defaults; the flags given change them
        try:
            default = resume_config(early.resume)  # a walk-forward run folder, or None
            default = default if default is not None else stored_config(early.resume)
        except ValueError as err:
            print(f"gper train: error: {err}", file=sys.stderr)
            return 2
    env = early.env or (default.env if default is not None else Config.env)
    try:
        device = pick_device(early.device or (default.device if default is not None else Config.device))
    except (ValueError, RuntimeError):  # a bad --device: the run's own check says so
        device = torch.device("cpu")
    walk = any(a.split("=")[0] in WALK_FLAGS for a in argv)
    cls = command_config(env, device, default, walk=walk)
    parsed = tyro.cli(
        cls,
        args=argv,
        default=from_config(cls, default) if default is not None else None,
        prog="gper train",
        description="Train DQN with GPU prioritized replay; writes metrics, a plot and checkpoints to a run folder.\n\n"
        + presets_table(),
        config=(tyro.conf.FlagConversionOff,),
    )
    config = to_config(parsed)
    log = print
    if config.progress:  # lines go above the progress bar; without one, plain prints need no tqdm
        try:
            log = require("tqdm.auto").tqdm.write
        except MissingExtra as err:
            print(err, file=sys.stderr)
            return 2
    try:
        if walk_spec(config) is not None:
            result = walk_forward(config, log=log)
            print("gper train: done")
            print(json.dumps({"folder": str(result.folder), "out_of_sample": result.report["out_of_sample"]}, indent=2))
            return 0
        results = train(config, log=log)
    except PeerFailed as err:  # under torchrun: the rank that failed says why; rank 0 says where
        if os.environ.get("RANK", "0") == "0":
            print(f"gper train: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # bad settings: one line, no traceback
        rank = os.environ.get("RANK", "0") if parallel.launched() else "0"
        print(f"gper train{f' (rank {rank})' if rank != '0' else ''}: error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:
        if "pip install" not in str(err):  # not a missing optional package: a real bug, with its traceback
            raise
        print(f"gper train: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # SIGINT: train wrote a checkpoint and said where
        print("gper train: interrupted", file=sys.stderr)
        return 130
    if parallel.launched() and os.environ.get("RANK", "0") != "0":
        return 0  # rank 0 prints the summary
    summary = {k: v for k, v in dataclasses.asdict(results).items() if k not in ("notes",)}
    print("gper train: done")
    print(json.dumps(summary, indent=2))
    return 0


#: the flags that make a run walk-forward (their presence picks the market-walk preset's help hints)
WALK_FLAGS = tuple(
    f"--{unit_flag}"
    for unit in ("months", "days")
    for unit_flag in (f"train-{unit}", f"val-{unit}", f"test-{unit}", f"step-{unit}")
) + ("--fold-train-bars", "--fold-val-bars", "--fold-test-bars", "--fold-step-bars")


def _early_flags(argv: list[str]) -> argparse.Namespace:
    """``--resume``, ``--env`` and ``--device`` in ``argv``, read before tyro parses the rest (they
    decide the defaults that ``--help`` shows and that the flags not given keep)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--resume", "--env", "--device"):
        parser.add_argument(flag)
    return parser.parse_known_args(argv)[0]

"""``gper train``: the command line of :func:`gper.dqn.train`, made by tyro from :class:`gper.dqn.Config`
(each field's docstring is its ``--help`` text).

    gper train                                  # cartpole, GPU if there is one
    gper train --env market --total-steps 1000000
    gper train --env gym:LunarLander-v3 --seed 2
    gper train --resume runs/cartpole__s1__20261129-120000 --total-steps 400000

With ``--resume``, the flags not given keep the checkpoint's settings
(:func:`gper.dqn.checkpoint.stored_config`). After SIGINT the command writes a checkpoint and
exits with status 130; after SIGTERM, with 143.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from gper.dqn._extra import MissingExtra, require
from gper.dqn.checkpoint import stored_config
from gper.dqn.config import Config
from gper.dqn.loop import train


def main(argv: list[str]) -> int:
    """Parse ``argv`` (the flags after ``gper train``), train, print the summary; the exit status."""
    try:
        tyro = require("tyro")
    except MissingExtra as err:
        print(err, file=sys.stderr)
        return 2
    default = None
    resume = _resume_flag(argv)
    if resume is not None:  # the checkpoint's settings are the defaults; the flags given change them
        try:
            default = stored_config(resume)
        except ValueError as err:
            print(f"gper train: error: {err}", file=sys.stderr)
            return 2
    config = tyro.cli(
        Config,
        args=argv,
        default=default,
        prog="gper train",
        description="Train DQN with GPU prioritized replay; writes metrics, a plot and checkpoints to a run folder.",
        config=(tyro.conf.FlagConversionOff,),
    )
    log = print
    if config.progress:  # lines go above the progress bar; without one, plain prints need no tqdm
        try:
            log = require("tqdm.auto").tqdm.write
        except MissingExtra as err:
            print(err, file=sys.stderr)
            return 2
    try:
        results = train(config, log=log)
    except ValueError as err:
        print(f"gper train: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # SIGINT: train wrote a checkpoint and said where
        print("gper train: interrupted", file=sys.stderr)
        return 130
    summary = {k: v for k, v in dataclasses.asdict(results).items() if k not in ("notes",)}
    print("gper train: done")
    print(json.dumps(summary, indent=2))
    return 0


def _resume_flag(argv: list[str]) -> str | None:
    """The value of ``--resume`` in ``argv``, read before tyro parses the rest."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--resume")
    return parser.parse_known_args(argv)[0].resume

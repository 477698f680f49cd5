"""``gper train``: the command line of :func:`gper.dqn.train`, made by tyro from :class:`gper.dqn.Config`
(each field's docstring is its ``--help`` text).

    gper train                                  # cartpole, GPU if there is one
    gper train --env market --total-steps 1000000
    gper train --env gym:LunarLander-v3 --seed 2
    gper train --resume runs/cartpole__s1__20261129-120000/checkpoint.pt
"""

from __future__ import annotations

import dataclasses
import json
import sys

from gper.dqn._extra import MissingExtra, require
from gper.dqn.config import Config
from gper.dqn.loop import train


def main(argv: list[str]) -> int:
    """Parse ``argv`` (the flags after ``gper train``), train, print the summary; the exit status."""
    try:
        tyro = require("tyro")
    except MissingExtra as err:
        print(err, file=sys.stderr)
        return 2
    config = tyro.cli(
        Config,
        args=argv,
        prog="gper train",
        description="Train DQN with GPU prioritized replay; writes metrics, a plot and a checkpoint to a run folder.",
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
    summary = {k: v for k, v in dataclasses.asdict(results).items() if k not in ("notes",)}
    print("gper train: done")
    print(json.dumps(summary, indent=2))
    return 0

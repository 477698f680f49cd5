"""``gper train``: :mod:`gper.dqn.command`'s command line, with walk-forward folds
(:func:`gper.walkforward.walk_forward`) for the market's window flags (``--train-months`` ...)."""

from __future__ import annotations

from gper.dqn import command
from gper.walkforward.run import resume_config, walk_forward


def main(argv: list[str]) -> int:
    """``gper train`` with ``argv``: a training run, or walk-forward folds; the exit status."""
    return command.main(argv, walk_forward=walk_forward, walk_resume=resume_config)

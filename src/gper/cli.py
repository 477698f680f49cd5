"""The ``gper`` command: a thin dispatcher to subcommands.

Each subcommand lives in its own module, which provides ``add_arguments(parser)`` and
``main(args) -> int``; add one by adding a line to :data:`COMMANDS`.

    gper train                  # DQN on cartpole, on the GPU if there is one
    gper bench --quick          # or: python -m gper bench --quick
"""

from __future__ import annotations

import argparse
import importlib
import sys

import gper

#: name -> (module with add_arguments and main, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("gper.dqn.command", "train DQN on the GPU with prioritized replay (default: cartpole)"),
    "bench": ("gper.bench.command", "time sample / update / add / step against the seeds' O(N) design"),
}
#: commands that parse their own flags (tyro); ``gper`` hands them the rest of the command line
OWN_PARSERS = {"train"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gper", description="GPU-resident prioritized experience replay.")
    parser.add_argument("--version", action="version", version=f"gper {gper.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        if name in OWN_PARSERS:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=f"gper {name}: {help_text}")
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the subcommand, return its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in OWN_PARSERS:
        return int(importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    args.command_line = " ".join(["gper", *argv])
    return int(args._main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``gper`` command: a thin dispatcher to subcommands.

Every subcommand lives in its own module, which provides ``main(argv: list[str]) -> int``: it
gets the rest of the command line and parses it itself. Add one by adding a line to
:data:`COMMANDS`.

    gper train                  # DQN on cartpole, on the GPU if there is one
    gper bench --quick          # or: python -m gper bench --quick
    gper bench peers --help
"""

from __future__ import annotations

import argparse
import importlib
import sys

import gper

#: name -> (module with ``main(argv) -> int``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("gper.commands.train", "train DQN on the GPU with prioritized replay (default: cartpole)"),
    "bench": (
        "gper.bench.command",
        "benchmarks: replay (vs the O(N) baselines), peers (vs other replay libraries), exactness (the peers'"
        " samplers), train-step, checkpoint (save and load), trajectory (the trajectory buffer), trainers"
        " (PureJaxRL's DQN beside gper train)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    width = max(map(len, COMMANDS))
    table = "\n".join(f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="gper",
        description="GPU-resident prioritized experience replay.",
        epilog=f"commands:\n{table}\n\n`gper COMMAND --help` shows a command's flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gper {gper.__version__}")
    parser.add_argument("command", choices=tuple(COMMANDS), metavar="COMMAND", help="see the commands below")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own flags")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``gper COMMAND ...`` (default ``sys.argv[1:]``): the command's ``main`` gets the rest; its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if not argv:
        parser.error(f"a COMMAND is required: {', '.join(COMMANDS)}")
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.main(list(args.args)) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

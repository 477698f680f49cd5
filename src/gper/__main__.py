"""``python -m gper``: the same as the ``gper`` command."""

from gper.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

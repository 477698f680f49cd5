"""The ``gper`` subcommands that run a trainer: each module gives ``main(argv) -> int``, which
``gper.cli`` dispatches to by name."""

"""One module per ``gper bench`` subcommand: its flags (``add_*_arguments``), the settings they give
(``*_config``) and its run (``run_*``); :mod:`gper.bench.command` dispatches to them."""

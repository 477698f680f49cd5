"""Benchmarks of gper: the timing helpers, and the replay sweep behind ``gper bench``.

* :mod:`gper.bench.timing`: :func:`time_fn` (eager calls) and :func:`time_graph` (replays of a
  captured CUDA graph), medians over repeats; reused by every gper benchmark.
* :mod:`gper.bench.workload`: the user's transition spec, random data, gper's buffer and the
  baselines it is measured against (the seeds' cumsum + searchsorted design, ``torch.multinomial``).
* :mod:`gper.bench.replay`: the sweep over capacities and batch sizes, and its flags.
* :mod:`gper.bench.report`: the header line (device, versions, commit), tables, result files.
"""

from gper.bench.replay import BenchConfig, BenchResult, run
from gper.bench.timing import Timing, capture_graph, time_fn, time_graph

__all__ = ["BenchConfig", "BenchResult", "Timing", "capture_graph", "run", "time_fn", "time_graph"]

"""Benchmarks of gper: the timers, the sweep engine, the peers, and the ``gper bench`` subcommands.

* :mod:`gper.bench.timing`: :func:`time_fn` (eager calls), :func:`time_graph` (replays of a
  captured CUDA graph), ``time_sync`` (JAX calls) and ``time_steps`` (training steps); reused
  by every gper benchmark.
* :mod:`gper.bench.workload`: the reference transition (51-float obs, int64 action, float32
  reward, 51-float next_obs, bool done), the trajectory workload's streams, and their random data.
* :mod:`gper.bench.harness`: result rows, the cell and group runners (timing, skips, running
  out of memory, deadlines).
* :mod:`gper.bench.peers`: one module per peer (gper, the O(N) baselines, TorchRL, cpprb,
  flashbax), each with its timing adapter and its exactness sampler.
* :mod:`gper.bench.buffer_sweep` (``gper bench replay``), :mod:`gper.bench.peers_sweep`
  (``gper bench peers``), :mod:`gper.bench.exactness` (``gper bench exactness``),
  :mod:`gper.bench.train_step` (``gper bench train-step``), :mod:`gper.bench.trajectory_sweep`
  (``gper bench trajectory``); :mod:`gper.bench.command` dispatches them, :mod:`gper.bench.commands` holds their flags.
* :mod:`gper.bench.report`: the header line (device, versions, commit), tables, result files.
"""

from gper.bench.buffer_sweep import BenchConfig, BenchResult, run
from gper.bench.timing import Timing, capture_graph, time_fn, time_graph

__all__ = ["BenchConfig", "BenchResult", "Timing", "capture_graph", "run", "time_fn", "time_graph"]

"""The runtime a reinforcement-learning trainer is built from, with no algorithm in it: a step of
named phases run eagerly or as CUDA graphs (:mod:`~gper.training.phases`) with per-phase timing
(:mod:`~gper.training.timing`), finished episodes recorded on the device
(:mod:`~gper.training.episodes`), asynchronous copies to the host (:mod:`~gper.training.readback`),
the run folder: metrics and plot (:mod:`~gper.training.runlog`), checkpoints that a crash cannot
leave half-written (:mod:`~gper.training.checkpoints`) and SIGINT/SIGTERM as requests to stop
(:mod:`~gper.training.signals`)."""

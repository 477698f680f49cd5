"""``gper bench trainers``: whole DQN training runs of gper beside other trainers' on CartPole-v1.

- :mod:`~gper.bench.trainers.purejaxrl_dqn`: PureJaxRL's ``dqn.py``, vendored with three marked patches
  (Apache-2.0, ``LICENSE-purejaxrl`` beside it); it imports JAX, gymnax and flashbax, so nothing
  else imports it but the worker.
- :mod:`~gper.bench.trainers.purejaxrl_run`: its worker process: N seeds in one ``jax.vmap``, timed.
- :mod:`~gper.bench.trainers.gper_run`: ``gper train`` with its preset and at PureJaxRL's settings.
- :mod:`~gper.bench.trainers.solve`: the env step at which the 100-episode mean first reached 475.
- :mod:`~gper.bench.trainers.table` and :mod:`~gper.bench.trainers.run`: the table, the files, the run.
"""

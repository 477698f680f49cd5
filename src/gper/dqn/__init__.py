"""DQN with prioritized replay, with the whole loop on the GPU.

    gper train                                   # cartpole, built-in defaults, GPU if there is one
    gper train --env market --seed 3             # the futures-style task on synthetic prices
    gper train --env gym:LunarLander-v3          # any Gymnasium id with discrete actions (CPU env)

    from gper.dqn import Config, train
    results = train(Config(env="cartpole", total_steps=100_000))

DQN is one algorithm on the trainer core (:mod:`gper.training`: the run's lifecycle, epochs,
checkpoints and resume, run folder, report, evaluation, data-parallel plumbing); this package holds
what is DQN's. In reading order: :mod:`~gper.dqn.config` (``Config``, the per-environment
``PRESETS``; its walk-forward section ``WalkForward`` in :mod:`~gper.dqn.walk_settings`),
:mod:`~gper.dqn.network` (the Q-network, the replay's rows),
:mod:`~gper.dqn.batch_source` (where a learn step's batch comes from), :mod:`~gper.dqn.replay_feed`
(the one replay interface the learner sees, whichever buffer feeds it), :mod:`~gper.dqn.agent`
(the collect and learn steps, the target update, exploration), :mod:`~gper.dqn.build` (``setup``:
the agent and its replay), :mod:`~gper.dqn.parallel` (what data-parallel DQN accepts),
:mod:`~gper.dqn.algorithm` (``DQN``, the algorithm the core runs; ``train``; what a resume may
change); ``gper train`` is :mod:`gper.commands.train`, above it.

What runs where, on a GPU:

- **collect** (one CUDA graph when the environment allows it): Q-network forward on the current
  observations, epsilon-greedy actions (epsilon computed on the device from a device step
  counter), environment step, ``add`` to the replay (:class:`~gper.PrioritizedReplayBuffer`, or
  with ``n_step`` > 1 or a next-step Gymnasium env :class:`~gper.TrajectoryReplayBuffer`),
  episode bookkeeping.
- **learn** (one CUDA graph): ``per_sample`` (draw, gather, IS weights) -> ``upload`` (the batch
  as network inputs) -> ``fwd_bwd`` (double-Q targets, Huber loss times IS weights, backward;
  loss and TD statistics summed on the device) -> ``per_update`` (priorities from the TD errors,
  beta annealed on the device; on a side stream, alongside the next phase) -> ``adam``
  (capturable Adam, soft target update). A hard target update (tau = 1) is one device copy
  launched from the host loop between steps.
- once an epoch: the sums and finished episodes are copied to pinned host memory and read (the
  epoch's one synchronisation), one line of per-phase GPU times is printed, metrics are written
  (``metrics.jsonl``, TensorBoard event files); every ``eval_every`` epochs the greedy policy is
  evaluated on an environment of its own, eagerly, outside the graphs.

Every ``time_every``-th step runs phase by phase (one graph per phase) with CUDA events between
the phases; the other steps replay the whole step as one graph. On the CPU the same code runs
eagerly and the phase times are host times.
"""

from gper.dqn.agent import Agent, LearnState
from gper.dqn.algorithm import DQN, stored_config, train
from gper.dqn.batch_source import Batch, BatchSource, FixedBatch
from gper.dqn.build import build_replay, setup
from gper.dqn.config import PRESETS, Config, pick_device, resolve
from gper.dqn.network import QNetwork, padded_width, replay_spec, trajectory_spec
from gper.dqn.walk_settings import WalkForward
from gper.training.environment import build_env
from gper.training.epochs import plan_steps, trains_at
from gper.training.report import Results

__all__ = [
    "DQN",
    "PRESETS",
    "Agent",
    "Batch",
    "BatchSource",
    "Config",
    "FixedBatch",
    "LearnState",
    "QNetwork",
    "Results",
    "WalkForward",
    "build_env",
    "build_replay",
    "padded_width",
    "pick_device",
    "plan_steps",
    "replay_spec",
    "resolve",
    "setup",
    "stored_config",
    "train",
    "trains_at",
    "trajectory_spec",
]

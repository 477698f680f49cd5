"""DQN as an algorithm on the trainer core: :data:`DQN` (its :class:`~gper.training.AlgorithmSpec`)
and :func:`train`, the trainer core run with it.

What is DQN's here: the agent it builds (:func:`gper.dqn.build.setup`: networks, loss, target
update, exploration, replay), its settings (:class:`~gper.dqn.Config` and the presets), what a
resumed run may change of them, how checkpoints of older gper read, and what it reports (its loss
sums and learn phases). The rest of a run is the core's (:mod:`gper.training`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gper.dqn.agent import SUM_ABS_TD, SUM_LOSS, SUM_Q, Agent
from gper.dqn.build import setup
from gper.dqn.config import TORCH_ADAM_EPS, Config, as_run, check_plain_run, cpu_threads, env_family, from_settings
from gper.dqn.population_agent import PopulationAgent
from gper.dqn.walk_settings import nest_walk
from gper.training import run_checkpoint
from gper.training.algorithm import AlgorithmSpec
from gper.training.report import Results
from gper.training.trainer import train as train_with

#: the learn step's phases in the order the phase line prints them (they run per_sample, upload,
#: fwd_bwd, grad_sync (data-parallel runs only), per_update, adam: see gper.dqn.agent; where one
#: kernel runs the forwards, loss, backward and Adam, learn takes the place of fwd_bwd and adam)
PHASE_ORDER = ("per_sample", "upload", "fwd_bwd", "learn", "grad_sync", "adam", "per_update")

#: the metric each device sum is reported as, per training step
LOSS_METRICS = {SUM_LOSS: "losses/td_loss", SUM_Q: "losses/q_values", SUM_ABS_TD: "losses/abs_td"}

#: settings a resumed run takes from its own configuration (beside total_steps): Adam at ``learning_rate``
HONOURED = ("learning_rate",)
#: where it computes: free to change on resume (beside the core's, gper.training.settings.RUN_FREE)
FREE = ("threads", "backend", "precision", "cuda_graphs", "fused_step")

#: settings that came after checkpoints of format 1 were first written, with the value those ran with
ADDED = {
    "n_step": 1,
    "replay": "flat",
    "gym_autoreset": "same-step",
    "her": "none",
    "her_ratio": 0.8,
    "weight_norm": "global",
    "distributed": "off",
    "population": 1,
    "sweep": (),
    "loss": "huber",
    "actions": 45,
    "vol_target": None,
    "turnover_bps": 0.0,
    "dueling": False,
}


#: Adam's epsilon of checkpoints written before ``adam_eps``: the pixel learner's was fixed at
#: 1.5e-4 (Rainbow's), every other learner's torch's
PIXEL_ADAM_EPS_BEFORE = 1.5e-4


def _upgrade(settings: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's settings in today's form: a setting it predates holds the value it ran with
    (:data:`ADDED`; ``adam_eps`` by learner), the walk-forward ones sit in ``walk`` (a checkpoint
    written before :attr:`Config.walk` holds them flat)."""
    pixels = env_family(str(settings.get("env", ""))) == "atari"  # the learner build.py picks
    before = {"adam_eps": PIXEL_ADAM_EPS_BEFORE if pixels else TORCH_ADAM_EPS}
    return nest_walk(ADDED | before | settings)


def _from_settings(settings: dict[str, Any]) -> Config:
    for name in ("hidden", "sweep"):  # tuples, which JSON holds as lists
        if isinstance(settings.get(name), list | tuple):
            settings = settings | {name: tuple(settings[name])}
    return from_settings(settings)


def _cpu_threads(cfg: Config, agent: Agent | PopulationAgent) -> int:
    n_actions = agent.n_actions if isinstance(agent, PopulationAgent) else agent.env.n_actions
    return cpu_threads(cfg, agent.obs_width, n_actions)


DQN = AlgorithmSpec(
    name="dqn",
    settings=Config,
    setup=setup,
    sum_metrics=LOSS_METRICS,
    learn_phases=PHASE_ORDER,
    honoured=HONOURED,
    free=FREE,
    cpu_threads=_cpu_threads,
    record=as_run,
    upgrade=_upgrade,
    from_settings=_from_settings,
    data_parallel=True,
)


def train(config: Config, log: Any = print) -> Results:
    """Train a DQN agent as ``config`` says; write the run folder; return the :class:`~gper.training.Results`.

    The trainer core's :func:`gper.training.train` with :data:`DQN` (checkpoints, resume, stop
    signals, data-parallel runs under torchrun: see there), after refusing walk-forward settings,
    which a plain run would ignore (``gper train`` runs those through :mod:`gper.walkforward`).

    Raises:
        ValueError: bad settings, settings a resume may not change, or a damaged checkpoint
            (:class:`~gper.training.checkpoints.CheckpointError`); each a one-line message.
    """
    check_plain_run(config)
    return train_with(DQN, config, log)


def stored_config(resume: str | Path) -> Config:
    """The settings of the checkpoint ``resume`` names, as the :class:`Config` to resume it with:
    ``run_dir`` and ``run_name`` are the defaults (so the run continues in the checkpoint's run
    folder) and ``resume`` is ``resume``. ``gper train --resume`` starts from these; the flags
    given change them. From Python: ``train(dataclasses.replace(stored_config(path), total_steps=...))``."""
    return run_checkpoint.stored_settings(DQN, resume)


def fixed_settings() -> tuple[str, ...]:
    """The settings a resumed DQN run must share with its checkpoint (they set shapes or the method)."""
    return run_checkpoint.fixed_settings(DQN)


__all__ = ["DQN", "fixed_settings", "stored_config", "train"]

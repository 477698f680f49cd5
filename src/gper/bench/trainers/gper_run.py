"""gper's side of ``gper bench trainers``: ``gper train`` on cartpole, once with its preset and once
at PureJaxRL's DQN settings, through :func:`gper.dqn.train` in the bench's own process.

:func:`purejaxrl_settings` turns PureJaxRL's config into :class:`gper.dqn.Config` fields, and
:data:`NOT_EXPRESSIBLE` says what of PureJaxRL's DQN no gper setting reproduces.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from gper.bench.trainers.solve import GOAL

#: what PureJaxRL's DQN does that no ``gper train`` setting reproduces (it is printed with the table)
NOT_EXPRESSIBLE = (
    "time limit: PureJaxRL stores done = terminated or truncated, so it does not bootstrap at CartPole's "
    "500-step limit; gper bootstraps there (only a termination ends the target)",
    "first training step: PureJaxRL's at env step 10,010 (timesteps > LEARNING_STARTS), gper's one collection "
    "step earlier",
    "initialisation: flax's Dense init (lecun normal weights, zero biases) against torch's nn.Linear init",
)

#: the settings a bench run changes from ``gper train``'s defaults on both rows: no evaluation,
#: checkpoints, TensorBoard files or progress bar, none of which PureJaxRL's run does either
QUIET = dict(eval_every=0, save=False, tensorboard=False, progress=False)

#: gper's rows: (trainer label, what it is)
GPER_ROWS = (
    ("gper", "cartpole preset"),
    ("gper", "PureJaxRL's settings"),
)


def purejaxrl_settings(pjx: dict[str, Any]) -> dict[str, Any]:
    """:class:`gper.dqn.Config` fields for PureJaxRL's DQN config ``pjx`` (its ``default_config()``).

    PureJaxRL counts its intervals in env steps of all envs together; gper's ``train_every`` counts
    collection steps (``num_envs`` env steps each) and ``target_every`` training steps.
    """
    n = int(pjx["NUM_ENVS"])
    if pjx["TRAINING_INTERVAL"] % n:
        raise ValueError(f"TRAINING_INTERVAL {pjx['TRAINING_INTERVAL']} is not a multiple of NUM_ENVS {n}")
    train_every = int(pjx["TRAINING_INTERVAL"]) // n
    # the target is copied every TARGET_UPDATE_INTERVAL env steps: that many training steps apart
    target_every = int(pjx["TARGET_UPDATE_INTERVAL"]) // (n * train_every)
    if pjx.get("LR_LINEAR_DECAY", False):
        raise ValueError("LR_LINEAR_DECAY has no gper setting")
    return dict(
        env="cartpole",
        total_steps=int(pjx["TOTAL_TIMESTEPS"]),
        num_envs=n,
        hidden=(120, 84),  # PureJaxRL's QNetwork: Dense(120), Dense(84)
        buffer_size=int(pjx["BUFFER_SIZE"]),
        batch_size=int(pjx["BUFFER_BATCH_SIZE"]),
        learning_rate=float(pjx["LR"]),
        max_grad_norm=0.0,  # optax.adam with no clipping
        gamma=float(pjx["GAMMA"]),
        tau=float(pjx["TAU"]),
        target_every=max(1, target_every),
        double_q=False,  # the target network's max over actions
        loss="mse",  # jnp.mean((chosen_action_qvals - target) ** 2)
        sampling="uniform",  # flashbax's flat buffer samples uniformly
        replay="flat",
        n_step=1,
        eps_start=float(pjx["EPSILON_START"]),
        eps_end=float(pjx["EPSILON_FINISH"]),
        exploration_fraction=float(pjx["EPSILON_ANNEAL_TIME"]) / float(pjx["TOTAL_TIMESTEPS"]),
        learning_starts=int(pjx["LEARNING_STARTS"]),
        train_every=train_every,
        solve_return=GOAL,
    )


def gper_configs(pjx: dict[str, Any], device: str, total_steps: int | None = None) -> list[dict[str, Any]]:
    """The :class:`gper.dqn.Config` fields of each row of :data:`GPER_ROWS`; ``total_steps``
    overrides both rows' (smoke runs)."""
    preset = dict(env="cartpole", solve_return=GOAL)
    rows = [preset, purejaxrl_settings(pjx)]
    extra = {"total_steps": total_steps} if total_steps else {}
    return [{**fields, **QUIET, **extra, "device": device, "seed": 1} for fields in rows]


def run_gper(fields: dict[str, Any], seeds: int, log: Any = print) -> dict[str, Any]:
    """Train ``seeds`` agents with ``fields`` in one ``gper train`` run and time it: one seed is the
    single agent's run, more are one population (``--population seeds``, agent ``i`` seed ``1 + i``)
    trained in the same launches."""
    import statistics

    from gper.dqn import Config, train

    extra = {"population": seeds} if seeds > 1 else {}
    with tempfile.TemporaryDirectory(prefix="gper-bench-trainers-") as run_dir:
        t0 = time.perf_counter()
        res = train(Config(**fields, **extra, run_dir=run_dir), log=log)
        call_s = time.perf_counter() - t0
    if res.population is None:
        steps, times = [res.solved_at_step], [res.solved_at_s]
    else:
        agents = res.population["per_agent"]
        steps, times = [a["solved_at_step"] for a in agents], [a["solved_at_s"] for a in agents]
    reached = [s for s in steps if s is not None]
    reached_s = [t for t in times if t is not None]
    return {
        "seeds": seeds,
        # what the call took beyond its training loop: building the agents, the replay, the graphs' capture
        "setup_s": max(0.0, call_s - res.wall_s),
        "run_s": res.wall_s,
        "total_env_steps": res.env_steps * seeds,  # env_steps counts each agent's
        "env_steps_per_s": res.env_steps * seeds / res.wall_s if res.wall_s > 0 else None,
        "solve_steps": steps,
        "reached": len(reached),
        "median_solve_step": statistics.median(reached) if reached else None,
        "time_to_goal_s": statistics.median(reached_s) if reached_s else None,
        # the whole population at the goal: the last agent's time, when every agent got there
        "all_at_goal_s": max(reached_s) if len(reached_s) == seeds else None,
        "device": res.device,
    }

"""DQN's part of a run's setup: :func:`setup` builds the agent (networks, optimizer, replay,
environments) that the trainer core (:func:`gper.training.train`) runs, :func:`build_replay` the
replay buffer its settings ask for."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import gper
from gper.distributed import ShardedPrioritizedReplayBuffer
from gper.dqn import parallel
from gper.dqn.agent import Agent
from gper.dqn.config import (
    Config,
    cpu_threads,
    env_family,
    is_goal_env_name,
    pick_device,
    replay_kind,
    resolve,
    trajectory_capacity,
)
from gper.dqn.network import GOAL_OBS_KEYS, goal_trajectory_spec, padded_width, replay_spec, trajectory_spec
from gper.dqn.pixel_agent import PixelAgent, pixel_replay
from gper.dqn.population_agent import PopulationAgent
from gper.dqn.sweep import agent_configs, parse_sweeps
from gper.envs import GoalEnv, VecEnv, is_goal_env
from gper.training.environment import build_env
from gper.training.epochs import collect_iterations, train_steps_before
from gper.training.parallel import GradientAverage, Launch


def build_replay(
    cfg: Config,
    obs_dim: int,
    device: torch.device,
    autoreset: str = "same-step",
    goal_env: GoalEnv | None = None,
    launch: Launch | None = None,
) -> gper.PrioritizedReplayBuffer | gper.TrajectoryReplayBuffer | ShardedPrioritizedReplayBuffer:
    """The replay buffer of ``cfg`` for observations of ``obs_dim`` floats (the padded width) from
    an environment whose :attr:`~gper.envs.base.VecEnv.autoreset` is ``autoreset``
    (:func:`~gper.dqn.config.replay_kind` picks flat or trajectory). The trajectory replay holds
    ``buffer_size // num_envs`` steps of each environment, a window of ``n_step``. On CUDA either
    falls back to the CPU by itself when the GPU lacks the memory.

    For a goal task (``goal_env``, whose observations are ``obs_dim`` floats unpadded) the
    trajectory replay stores observation, achieved and desired goal apart
    (:func:`~gper.dqn.network.goal_trajectory_spec`) and relabels goals as ``cfg.her`` says, the
    rewards and terminations recomputed by the environment's ``compute_reward`` and
    ``compute_terminated``.

    With ``launch`` (a data-parallel run) this rank's part of one
    :class:`~gper.distributed.ShardedPrioritizedReplayBuffer` of ``buffer_size`` slots over the group,
    in ``launch.mode``: flat replay only (:func:`gper.dqn.parallel.check_settings`)."""
    # the replay settings every kind takes from the run's
    common = dict(
        alpha=cfg.alpha,
        beta=cfg.beta,
        sampling=cfg.sampling,
        weight_norm=cfg.weight_norm,
        device=device,
        backend=cfg.backend,
        seed=cfg.seed,
    )
    if launch is not None:
        return ShardedPrioritizedReplayBuffer(cfg.buffer_size, replay_spec(obs_dim), mode=launch.mode, **common)
    if replay_kind(cfg, autoreset) == "trajectory":
        goal: dict[str, Any] = {}
        spec = trajectory_spec(obs_dim)
        if goal_env is not None:
            spec = goal_trajectory_spec(obs_dim, goal_env.goal_dim)
            her = gper.HindsightRelabeling(
                reward_fn=goal_env.compute_reward,
                terminated_fn=goal_env.compute_terminated,
                strategy=cfg.her,
                relabel_ratio=cfg.her_ratio,
            )
            goal = {"obs_keys": GOAL_OBS_KEYS, "her": her}
        return gper.TrajectoryReplayBuffer(
            trajectory_capacity(cfg),
            cfg.num_envs,
            spec,
            window=cfg.n_step,
            autoreset=autoreset,  # the env says how it resets: nothing is left to the buffer's guess
            **common,
            **goal,
        )
    return gper.PrioritizedReplayBuffer(cfg.buffer_size, replay_spec(obs_dim), **common)


def setup(config: Config, log: Any = print, launch: Launch | None = None) -> tuple[Config, Agent, list[str]]:
    """The resolved settings, the agent (networks, optimizer, replay, environments) and notes on the device.

    With ``launch`` (a data-parallel run): this rank's agent, on ``launch.device``, its torch
    generators and environments seeded ``seed + rank``, its networks rank 0's (broadcast), its
    replay a shard of the group's, its gradients averaged over the group every step."""
    device = pick_device(config.device) if launch is None else launch.device
    notes: list[str] = []
    if device.type == "cpu":
        notes.append("no CUDA GPU: training on the CPU with the CPU presets (smaller sizes, no CUDA graphs)")
    cfg = resolve(config, device)
    rank = 0 if launch is None else launch.rank
    if env_family(cfg.env) == "atari":
        return setup_pixels(cfg, device, launch, notes, log)
    if launch is not None:
        parallel.check_settings(cfg, launch.world_size)
    if cfg.population > 1 or cfg.sweep:
        return setup_population(cfg, device, launch, notes, log)
    torch.manual_seed(cfg.seed + rank)
    if device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed + rank)
    cfg, env, rb = _env_and_replay(cfg, device, launch)
    if launch is not None:
        notes.append(
            f"data-parallel on {launch.world_size} process{'es' if launch.world_size > 1 else ''} ({launch.mode} "
            f"sharded replay): global batch {launch.world_size * cfg.batch_size}, "
            f"{cfg.buffer_size // launch.world_size} replay slots a rank"
        )
    if rb.device != device:  # the replay did not fit on the GPU: everything moves to the CPU
        notes.append(
            f"not enough GPU memory for a replay of {rb.nbytes_estimate / 2**30:.1f} GiB: "
            "training on the CPU with the CPU presets"
        )
        del rb
        device = torch.device("cpu")
        env.close()
        cfg, env, rb = _env_and_replay(resolve(dataclasses.replace(config, device="cpu"), device), device)
    if device.type == "cpu" and cfg.threads is None:
        n = cpu_threads(cfg, padded_width(env.obs_dim), env.n_actions)
        notes.append(f"{n} torch thread{'s' if n > 1 else ''} for this network's size (--threads to change)")
    if cfg.solve_return is None and env.reward_threshold is not None:  # gym:<ID>: its registered threshold
        cfg = dataclasses.replace(cfg, solve_return=float(env.reward_threshold))
    for note in notes:
        log(f"gper train: {note}")
    total_train = train_steps_before(cfg, collect_iterations(cfg))  # beta reaches 1 at the last one
    if launch is None:
        return cfg, Agent(cfg, env, rb, total_train), notes
    average = GradientAverage(launch.world_size)
    agent = Agent(cfg, env, rb, total_train, grad_sync=average, env_seed=cfg.seed + rank)
    launch.broadcast_parameters([agent.qnet, agent.target])  # one network on every rank from the start
    return cfg, agent, notes


def _env_and_replay(cfg: Config, device: torch.device, launch: Launch | None = None) -> tuple[Config, VecEnv, Any]:
    """The environment and the replay of ``cfg`` (resolved) on ``device``, and ``cfg`` with ``replay``
    set to the kind built (``auto`` resolved against the environment's autoreset), which the run's
    record and checkpoints keep."""
    env = build_env(cfg, device, rank=0 if launch is None else launch.rank)
    try:
        cfg = dataclasses.replace(cfg, replay=replay_kind(cfg, env.autoreset))
        if launch is not None and cfg.replay != "flat":
            raise ValueError(parallel.NO_TRAJECTORY)
    except ValueError:
        env.close()
        raise
    if is_goal_env(env):  # its fields are the observation's parts, unpadded (the network input is padded)
        return cfg, env, build_replay(cfg, env.obs_dim, device, env.autoreset, goal_env=env)
    return cfg, env, build_replay(cfg, padded_width(env.obs_dim), device, env.autoreset, launch=launch)


def setup_population(
    cfg: Config, device: torch.device, launch: Launch | None, notes: list[str], log: Any
) -> tuple[Config, PopulationAgent, list[str]]:
    """A population's part of :func:`setup`: ``cfg.population`` agents for each point of the
    ``cfg.sweep`` grid (:func:`gper.dqn.sweep.agent_configs`), agent ``i`` seeded ``seed + i``, as one
    :class:`~gper.dqn.population_agent.PopulationAgent`.

    Raises:
        ValueError: what a population does not train on (one line each): several processes, the
            trajectory replay (n-step targets, an environment that resets on the next step, a
            goal task), an environment with a final test of its own (the market's).
    """
    from gper.envs import registry

    if launch is not None:
        raise ValueError("a population trains in one process: run it without torchrun (or train one agent per rank)")
    spec = registry.lookup(cfg.env)
    if spec is not None and spec.final_test is not None:
        raise ValueError(
            f"{cfg.env}'s final test plays one policy: train its agents one run at a time, not as a population"
        )
    if is_goal_env_name(cfg.env) or cfg.n_step > 1 or cfg.replay == "trajectory":
        raise ValueError("a population trains on the flat replay: n_step 1, no goal task, --replay flat or auto")
    if spec is not None and len(spec.autoreset) > 1 and cfg.gym_autoreset == "next-step":
        raise ValueError(f"{cfg.env} resetting on the next step needs the trajectory replay: not for a population")
    agents = agent_configs(dataclasses.replace(cfg, replay="flat"), cfg.population, parse_sweeps(cfg.sweep))
    cfg = agents[0]
    total_train = train_steps_before(cfg, collect_iterations(cfg))
    agent = PopulationAgent(agents, device, total_train)
    if device.type == "cpu" and cfg.threads is None:
        n = cpu_threads(cfg, agent.obs_width, agent.n_actions)
        notes.append(f"{n} torch thread{'s' if n > 1 else ''} for this network's size (--threads to change)")
    grid = f" over a grid of {len(agents) // cfg.population} settings" if cfg.sweep else ""
    notes.append(f"a population of {len(agents)} agents{grid}, seeds {cfg.seed}..{cfg.seed + len(agents) - 1}")
    if cfg.solve_return is None and agent.blocks[0].env.reward_threshold is not None:
        cfg = dataclasses.replace(cfg, solve_return=float(agent.blocks[0].env.reward_threshold))
    for note in notes:
        log(f"gper train: {note}")
    return dataclasses.replace(cfg, seed=agents[0].seed), agent, notes


def setup_pixels(
    cfg: Config, device: torch.device, launch: Launch | None, notes: list[str], log: Any
) -> tuple[Config, PixelAgent, list[str]]:
    """The part of :func:`setup` for pixels (``atari:<Game>``): the games, the frame-stack replay
    and a :class:`~gper.dqn.pixel_agent.PixelAgent`.

    Raises:
        ValueError: what pixel training does not do (one line each): several processes, a sweep,
            hindsight relabelling, the flat replay; a replay too large for the device's memory.
    """
    if launch is not None:
        raise ValueError("pixel training runs in one process: run it without torchrun")
    if cfg.sweep:
        raise ValueError("pixel training takes no --sweep: a population of seeds (--population N) or one run a setting")
    if cfg.her != "none" or cfg.replay == "flat":
        raise ValueError("pixel training learns from the trajectory replay's frame stacks: --replay auto, no --her")
    torch.manual_seed(cfg.seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed)
    cfg = dataclasses.replace(cfg, replay="trajectory")
    n = cfg.population
    env = build_env(dataclasses.replace(cfg, num_envs=cfg.num_envs * n), device)  # agent i: games [i E, (i + 1) E)
    try:
        try:
            rb = pixel_replay(cfg, env, device, agents=n)
        except torch.OutOfMemoryError:
            raise ValueError(
                f"the replay of {cfg.buffer_size:,} transitions{f' for each of {n} agents' if n > 1 else ''} (about "
                f"7 KB each) does not fit in {device}'s memory: lower --buffer-size"
            ) from None
    except BaseException:
        env.close()
        raise
    each = f"{n} agents (seeds {cfg.seed}..{cfg.seed + n - 1}), each with " if n > 1 else ""
    notes.append(
        f"{each}{rb.capacity:,} transitions of {cfg.num_envs} streams, each frame stored once and stacked by "
        f"{env.frame_stack} at sample time: {rb.nbytes_estimate / 2**30:.2f} GiB in all"
    )
    for note in notes:
        log(f"gper train: {note}")
    total_train = train_steps_before(cfg, collect_iterations(cfg))
    try:
        return cfg, PixelAgent(cfg, env, rb, total_train, agents=n), notes
    except BaseException:
        env.close()
        raise

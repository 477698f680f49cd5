"""DQN on pixels (``atari:<Game>``): :class:`PixelAgent`, a learner of the trainer core.

Double DQN with proportional prioritized replay and n-step returns on the Nature network
(:class:`~gper.dqn.pixel_net.NatureQNetwork`), the replay a :class:`gper.TrajectoryReplayBuffer`
that stores each frame once and builds the ``[B, S, 84, 84]`` stacks at sample time
(``frame_stack``): a million transitions take about 7 GB, not the 56 GB of stored stack pairs.

The collect step overlaps the games with the GPU. It collects the step whose actions the last
collect sent (:meth:`~gper.envs.atari.AtariVecEnv.step_wait`), adds it to the replay (each
stream's newest frame, the reward clipped to its sign for learning), chooses the next actions on
the GPU and sends them (:meth:`~gper.envs.atari.AtariVecEnv.step_async`), so ale-py's threads play
them while the learn step that follows runs on the GPU. The one synchronisation of an iteration
is the actions' copy to the host.

The learn step's phases (``per_sample``, ``fwd_bwd``, ``per_update``, ``adam``) are captured in
CUDA graphs as the MLP agent's are (:class:`~gper.training.phases.PhasedStep`): the draw and its
stacks, the uint8-to-float conversion, both forwards, the loss, backward, clipping, Adam and the
priority update replay as one graph. The episodes reported are whole games with their raw
scores (:attr:`~gper.envs.atari.AtariVecEnv.game_over`), while learning ends an episode at each
lost life.

A population (``agents`` = N > 1, ``--population N``) trains N agents of seeds ``seed .. seed + N - 1``
at once: one environment of ``N * num_envs`` games (agent ``i`` plays games ``[i E, (i + 1) E)``),
one replay of N instances (``instances=N``: each agent draws from its own exact prioritized
buffer), N networks evaluated as one (:class:`~gper.dqn.pixel_net.NatureQNetworks`: grouped
convolutions and batched matmuls, the kernels of one network for all N) with one Adam over them
(Adam is per element: N independent ones), each agent's gradient clipped on its own, and one learn
step graph for all.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

import gper
from gper.dqn.agent import N_SUMS
from gper.dqn.config import Config
from gper.dqn.fused_adam import load_adam_state
from gper.dqn.fused_loss import elementwise_loss
from gper.dqn.pixel_net import NatureQNetwork, NatureQNetworks
from gper.envs.atari import FRAME, AtariVecEnv
from gper.training.episodes import EpisodeTracker
from gper.training.phases import PhasedStep
from gper.training.timing import PhaseTimer


def pixel_replay(cfg: Config, env: AtariVecEnv, device: torch.device, agents: int = 1) -> gper.TrajectoryReplayBuffer:
    """The replay of ``cfg`` for ``env``: its streams' frames stored once, stacks of ``env.frame_stack``;
    for ``agents`` > 1, an instance each (``env.num_envs // agents`` streams, ``buffer_size`` transitions)."""
    spec = {"obs": (FRAME, torch.uint8), "action": ((), torch.int64), "reward": ((), torch.float32)}
    streams = env.num_envs // agents
    capacity = max(cfg.buffer_size // streams, cfg.n_step + 2) * streams
    return gper.TrajectoryReplayBuffer(
        capacity, streams, spec, window=cfg.n_step, frame_stack=env.frame_stack, autoreset="same-step",
        sampling=cfg.sampling, alpha=cfg.alpha, beta=cfg.beta, weight_norm=cfg.weight_norm, device=device,
        backend=cfg.backend, seed=cfg.seed, cuda_graphs=cfg.cuda_graphs, instances=agents if agents > 1 else None,
        cpu_fallback=False,  # the networks learn on the device: a replay in host memory is no use to them
    )  # fmt: skip


class PixelAgent:
    """Networks, optimizer, replay and the collect and learn steps of DQN on frame stacks.

    Args:
        cfg: resolved settings (``hidden[0]``: the fully connected layer's units; ``dueling``).
        env: the games (an :class:`~gper.envs.atari.AtariVecEnv`), ``agents * cfg.num_envs`` of them.
        rb: its replay (:func:`pixel_replay`, of ``agents`` instances).
        total_train_steps: training steps of the run; beta reaches 1 at the last one.
        agents: N agents trained together (see the module docstring); agent ``i``'s network is
            seeded ``cfg.seed + i``.
    """

    def __init__(
        self, cfg: Config, env: AtariVecEnv, rb: gper.TrajectoryReplayBuffer, total_train_steps: int, agents: int = 1
    ) -> None:
        self.cfg, self.env, self.rb, self.agents = cfg, env, rb, agents
        device = self.device = env.device
        cuda = device.type == "cuda"
        self.n_actions, self.obs_width = env.n_actions, env.obs_dim
        nets = []
        for i in range(agents):
            torch.manual_seed(cfg.seed + i)
            nets.append(NatureQNetwork(env.frame_stack, env.n_actions, cfg.hidden[0], cfg.dueling).to(device))
        # one agent: its network, [B, ...] -> [B, A]; N: all N as one, [N, B, ...] -> [N, B, A]
        self.qnets = nets[0] if agents == 1 else NatureQNetworks(nets).to(device)
        self.targets = copy.deepcopy(self.qnets).requires_grad_(False)
        self.optimizer = torch.optim.Adam(
            self.qnets.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps, capturable=cuda, fused=cuda or None
        )
        # env steps (one agent's: each agent plays cfg.num_envs games), training steps
        self.counters = torch.zeros(2, dtype=torch.float64, device=device)
        self.sums = torch.zeros(*((agents,) if agents > 1 else ()), N_SUMS, dtype=torch.float64, device=device)
        self.beta_t = torch.full((), cfg.beta, dtype=torch.float32, device=device)
        self.episodes = EpisodeTracker(env.num_envs, device, agents=agents)
        self.total_train_steps = max(1, total_train_steps)
        self.autocast = cuda and cfg.precision == "bf16"
        self.env_steps = 0  # as the host counts them (the exploration schedule)
        self.learn_state = SimpleNamespace(batch=None, td=None, grads=[])
        phases = {"per_sample": self._sample, "fwd_bwd": self._fwd_bwd, "per_update": self._per_update}
        self.learn = PhasedStep(
            phases | {"adam": self._adam}, device, cfg.cuda_graphs and cuda, state=self.learn_state,
            concurrent=("per_update",),
        )  # fmt: skip
        self.obs = env.reset(seed=cfg.seed)
        self._action = self._act(self.obs)
        env.step_async(self._action)

    # ---- collect

    def epsilon(self, env_steps: float) -> float:
        """Exploration rate after ``env_steps``: linear from eps_start to eps_end, then flat."""
        cfg = self.cfg
        frac = min(env_steps / (cfg.exploration_fraction * cfg.total_steps), 1.0)
        return cfg.eps_start + (cfg.eps_end - cfg.eps_start) * frac

    @property
    def qnet(self) -> NatureQNetwork:
        """Agent 0's network (the only one's; a population's: a copy of its weights)."""
        return self.network(0)

    @property
    def target(self) -> NatureQNetwork:
        """Agent 0's target network (as :attr:`qnet`)."""
        return self.targets if self.agents == 1 else self.targets.network(0)

    def network(self, i: int) -> NatureQNetwork:
        """Agent ``i``'s network: one agent's is the network it trains; a population's is a copy of
        agent ``i``'s weights (its networks train as one :class:`NatureQNetworks`), for reading."""
        if self.agents == 1 and i != 0:
            raise IndexError(f"agent {i} of a single agent")
        return self.qnets if self.agents == 1 else self.qnets.network(i)

    def _per_agent(self, nets: nn.Module, obs: torch.Tensor) -> torch.Tensor:
        """Q-values of ``obs`` [N * k, S, 84, 84], block ``i`` of ``k`` by agent ``i``'s network."""
        if self.agents == 1:
            return nets(obs)
        return nets(obs.unflatten(0, (self.agents, -1))).flatten(0, 1)

    def _act(self, obs: torch.Tensor) -> torch.Tensor:
        n = self.env.num_envs
        with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            greedy = self._per_agent(self.qnets, obs).argmax(dim=1)
        explore = torch.rand(n, device=self.device) < self.epsilon(self.env_steps)
        return torch.where(explore, torch.randint(0, self.n_actions, (n,), device=self.device), greedy)

    def collect_step(self, timer: PhaseTimer | None) -> None:
        """The step the last collect sent, into the replay; the next actions chosen and sent."""
        if timer is not None:
            timer.begin()
            timer.mark("collect")
        step = self.env.step_wait()
        n = self.env.num_envs
        data = {
            "obs": self.obs[:, -1],
            "action": self._action,
            "reward": torch.sign(step.reward),  # clipped for learning; the episodes keep the score
            "next_obs": step.next_obs[:, -1],
            "terminated": step.terminated,
            "truncated": step.truncated,
        }
        if self.agents > 1:  # [N, E, ...]: each agent's games into its own instance
            data = {k: v.unflatten(0, (self.agents, -1)) for k, v in data.items()}
        self.rb.add(data)
        e = n // self.agents  # steps counted as one agent's, as the trainer counts them (each agent's games)
        self.env_steps += e
        self.counters[0] += e
        self.episodes.record(step.reward, self.env.game_over, self.counters[0])
        self.obs = step.obs
        self._action = self._act(self.obs)
        self.env.step_async(self._action)  # the games play while the GPU learns
        if timer is not None:
            timer.end()

    # ---- learn

    def _sample(self) -> None:
        cfg = self.cfg
        self.learn_state.batch = self.rb.sample(cfg.batch_size, n_step=cfg.n_step, gamma=cfg.gamma, beta=self.beta_t)

    def _fwd_bwd(self) -> None:
        s, cfg = self.learn_state, self.cfg
        b = s.batch
        self.optimizer.zero_grad(set_to_none=True)
        # a population's batch is [N, B, ...]: the agents' rows side by side, each through its own networks
        flat = (lambda x: x.flatten(0, 1)) if self.agents > 1 else (lambda x: x)  # noqa: E731
        obs, next_obs, action = flat(b["obs"]), flat(b["next_obs"]), flat(b["action"])
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            q = self._per_agent(self.qnets, obs).float().gather(1, action.unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                next_target = self._per_agent(self.targets, next_obs).float()
                if cfg.double_q:
                    best = self._per_agent(self.qnets, next_obs).argmax(dim=1, keepdim=True)
                    next_q = next_target.gather(1, best).squeeze(1)
                else:
                    next_q = next_target.max(dim=1).values
                y = flat(b["reward"]) + flat(b["discount"]) * next_q
        shape = b.weights.shape  # [B], or [N, B]
        q, y = q.view(shape), y.view(shape)
        each = (elementwise_loss(q, y, cfg.loss) * b.weights).mean(dim=-1)  # each agent's loss
        each.sum().backward()  # the agents share no parameter: each gets its own loss's gradient
        s.td = (q - y).detach()
        self.sums += torch.stack((each.detach(), q.detach().mean(dim=-1), s.td.abs().mean(dim=-1)), dim=-1)
        s.grads = [p.grad for p in self.qnets.parameters()]

    def _per_update(self) -> None:
        s = self.learn_state
        if self.cfg.sampling != "uniform":
            self.rb.update_priorities(s.batch, s.td)
        self.beta_t.add_((1.0 - self.cfg.beta) / self.total_train_steps).clamp_(max=1.0)

    def _adam(self) -> None:
        if self.cfg.max_grad_norm > 0 and self.agents == 1:
            nn.utils.clip_grad_norm_(self.qnets.parameters(), self.cfg.max_grad_norm, foreach=True)
        elif self.cfg.max_grad_norm > 0:  # each agent's gradient on its own
            self.qnets.clip_grad_norm_(self.cfg.max_grad_norm)
        self.optimizer.step()
        self.counters[1] += 1
        if self.cfg.tau < 1.0:
            with torch.no_grad():
                torch._foreach_lerp_(list(self.targets.parameters()), list(self.qnets.parameters()), self.cfg.tau)

    def learn_step(self, train_step: int, timer: PhaseTimer | None) -> None:
        """Training step ``train_step`` (counted from 1), then the hard target update when one is due."""
        self.learn.run(timer)
        if self.cfg.tau >= 1.0 and train_step % self.cfg.target_every == 0:
            with torch.no_grad():
                torch._foreach_copy_(list(self.targets.parameters()), list(self.qnets.parameters()))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions for frame stacks ``obs`` (evaluation; a population's: block ``i`` agent ``i``'s)."""
        with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self._per_agent(self.qnets, obs).argmax(dim=1)

    # ---- what the trainer core reads

    def device_values(self) -> dict[str, torch.Tensor]:
        return {"beta": self.beta_t}

    def after_sync(self) -> None:
        if self.cfg.sampling == "rank":
            self.rb.stats()
            self.rb.refresh_ranks()

    def charts(self, host: dict[str, torch.Tensor], env_step: int) -> dict[str, float]:
        return {"charts/epsilon": float(self.epsilon(env_step)), "charts/beta": float(host["beta"])}

    def honour_settings(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.learning_rate

    def state_dict(self, *, replay: bool = True) -> dict[str, Any]:
        """Networks, optimizer, counters, sums, beta, episodes and, with ``replay``, the replay.
        The games' emulator state is not kept: a resumed run starts new games."""
        state = {
            "qnet": self.qnets.state_dict(),
            "target": self.targets.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "counters": self.counters,
            "sums": self.sums,
            "beta": self.beta_t,
            "episodes": self.episodes.state_dict(),
        }
        if replay:
            state["replay"] = self.rb.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], *, replay: bool = True) -> None:
        """Restore :meth:`state_dict` in place; new games start (seeded by the step reached), and the
        returns of the games that were in flight are dropped."""
        self.qnets.load_state_dict(state["qnet"])
        self.targets.load_state_dict(state["target"])
        load_adam_state(self.optimizer, state["optimizer"])
        if replay:
            self.rb.load_state_dict(state["replay"])
        self.counters.copy_(state["counters"])
        self.sums.copy_(state["sums"])
        self.beta_t.copy_(state["beta"])
        self.episodes.load_state_dict(state["episodes"])
        self.episodes.restart()
        self.env_steps = int(self.counters[0].item())
        # new games from a seed of the step reached, not the run's opening games again; the replay reads
        # the jump as the end of each stream's episode (truncated)
        self.obs = self.env.reset(seed=(self.cfg.seed * 1_000_003 + self.env_steps) % 2**31)
        self._action = self._act(self.obs)
        self.env.step_async(self._action)

"""A population of N DQN agents trained at once: :class:`PopulationAgent`.

Agent ``i`` is the single run seeded ``seed + i``: its own environments, network, target, Adam
state, replay (instance ``i`` of one ``PrioritizedReplayBuffer(..., instances=N)``) and random
stream. The steps run every agent in the same launches: the stacked networks
(:mod:`gper.dqn.population_net`), one loss (:mod:`gper.dqn.population_loss`), one Adam step
(:mod:`gper.dqn.population_adam`), one replay call. The learn step has the single agent's five
phases (``per_sample -> upload -> fwd_bwd -> per_update -> adam``) and the same CUDA graphs; where
the network is small enough (:func:`gper.dqn.population_fused_learn.fused_learn_supported`), on
CUDA, ``fwd_bwd`` and ``adam`` are one phase ``learn`` of two kernels (three with clipping)
(:mod:`gper.dqn.population_fused_learn`): ``per_sample -> upload -> learn -> per_update``.

Where the random numbers come from decides whether agent ``i`` reproduces its single run bit for
bit. On the CPU each agent keeps its own environments and its own state of torch's generator
(swapped in around its draws: exploration, the environments' resets), so agent ``i`` draws what
the single run seeded ``seed + i`` draws, in the same order, and its networks compute per agent
(a batched matmul differs from the single GEMM in the last bits). On CUDA the agents' environments
are one vectorized environment of ``N * num_envs`` copies drawing from torch's default generator
(what a CUDA graph replays afresh), and the networks run as batched matmuls: each agent is then a
faithful DQN of its seed, not the single run's bits.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

import gper
from gper.dqn.config import Config
from gper.dqn.fused_act import epsilon_greedy, fused_act_supported
from gper.dqn.learn_state import LearnState
from gper.dqn.network import QNetwork, padded_width, replay_spec
from gper.dqn.population_adam import PopulationAdam, hard_update_, soft_update_
from gper.dqn.population_fused_learn import MAX_WIDTH, fused_learn_supported, population_learn_step
from gper.dqn.population_loss import clip_grad_norms_, clip_scales, population_loss
from gper.dqn.population_net import StackedQNetwork
from gper.dqn.sweep import PerAgent, check_shared
from gper.envs import VecEnv
from gper.training.environment import build_env
from gper.training.episodes import EpisodeTracker
from gper.training.phases import PhasedStep
from gper.training.timing import PhaseTimer

#: slots of :attr:`PopulationAgent.sums` (each agent's row), as the single agent's
N_SUMS = 3


@dataclasses.dataclass
class EnvBlock:
    """Environments of consecutive agents ``[first, first + agents)`` stepped as one, and the state of
    torch's generator they draw from (None: the default generator, as it runs)."""

    env: VecEnv
    first: int
    agents: int
    rng: torch.Tensor | None = None

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        """Torch's generator holds this block's stream inside the block (no swap when ``rng`` is None)."""
        if self.rng is None:
            yield
            return
        outside = torch.get_rng_state()
        torch.set_rng_state(self.rng)
        try:
            yield
        finally:
            self.rng = torch.get_rng_state()
            torch.set_rng_state(outside)


#: builds an agent's (or a batched population's) training environment from settings whose ``seed`` and
#: ``num_envs`` are its own: :func:`gper.training.environment.build_env` by default, a walk-forward
#: fold's training window in :mod:`gper.walkforward.fold`
EnvFactory = Callable[[Config, torch.device], VecEnv]


def single_run_start(
    cfg: Config, seed: int, device: torch.device, make_env: EnvFactory = build_env
) -> tuple[VecEnv, QNetwork, torch.Tensor]:
    """What a single run seeded ``seed`` builds before its first step, drawing from torch's
    generator in its order: torch seeded, the environment (its first reset), the network, the
    agent's reset. Returns the environment, the network (on the CPU) and the first observations."""
    torch.manual_seed(seed)
    env = make_env(dataclasses.replace(cfg, seed=seed), device)
    width = padded_width(env.obs_dim)
    net = QNetwork(width, env.n_actions, cfg.hidden)
    obs = F.pad(env.reset(seed=seed), (0, width - env.obs_dim))
    return env, net, obs


class PopulationAgent:
    """N DQN agents of one architecture on one device, agent ``i`` with settings ``cfgs[i]`` (the
    seed and the settings of :data:`gper.dqn.sweep.SWEEPABLE` may differ between them).

    The trainer core drives it as it drives :class:`~gper.dqn.Agent` (the members of
    :class:`gper.training.Learner`), plus :attr:`agents`. Flat replay only (``n_step`` 1, an
    environment that resets in the same step).

    Args:
        cfgs: each agent's resolved settings (:func:`gper.dqn.resolve`;
            :func:`gper.dqn.sweep.agent_configs` makes them: seed ``seed + i``).
        device: where the population trains.
        total_train_steps: training steps of the run (beta reaches 1 at the last).
        exact: each agent its own environments and generator stream, and per-agent network
            arithmetic: the single runs' bits (default on the CPU); False: one vectorized
            environment and batched matmuls (the default on CUDA).
        fused_learn: the learn step's forwards, loss, backward, clipping, Adam and soft target
            update as one kernel (:mod:`gper.dqn.population_fused_learn`), for networks it holds
            (two hidden layers of up to 128 units); None (default): where ``fused_step`` is on, the
            population's kernels are Triton's, the device CUDA and the precision TF32 or FP32.
            True on the CPU (with ``backend="triton"``) runs it under the Triton interpreter (tests).
        fused_collect: the collect step's actions (every agent's forward, argmax, exploration rate
            and coins) in one kernel (:mod:`gper.dqn.fused_act`) and its episode records in one
            (:mod:`gper.training.episodes_kernel`), for batched populations (not ``exact``) whose
            network the kernel holds; None (default): on CUDA with the population's Triton kernels
            and ``fused_step``, not in bf16. True on the CPU (with ``backend="triton"`` and
            ``exact=False``) runs them under the Triton interpreter (tests).
        make_env: builds the training environments from settings and a device (:data:`EnvFactory`):
            ``exact``, each agent's from its settings; batched, one of ``agents * num_envs``
            copies from the first agent's. Default: the settings' environment
            (:func:`gper.training.environment.build_env`).
    """

    def __init__(
        self,
        cfgs: Sequence[Config],
        device: torch.device,
        total_train_steps: int,
        exact: bool | None = None,
        fused_learn: bool | None = None,
        fused_collect: bool | None = None,
        make_env: EnvFactory = build_env,
    ) -> None:
        cfgs = list(cfgs)
        if not cfgs:
            raise ValueError("a population needs at least one agent's settings")
        check_shared(cfgs)
        cfg, agents = cfgs[0], len(cfgs)
        self.cfg, self.cfgs, self.agents, self.device = cfg, cfgs, agents, device
        self.exact = device.type == "cpu" if exact is None else bool(exact)
        cuda = device.type == "cuda"
        self.blocks, nets, obs = self._start(cfgs, device, make_env)
        env0 = self.blocks[0].env
        self.obs_dim, self.n_actions = env0.obs_dim, env0.n_actions
        self.obs_width = padded_width(env0.obs_dim)
        self.num_envs = cfg.num_envs  # each agent's
        self.qnet = StackedQNetwork.from_networks(nets).to(device)
        self.target = self.qnet.detached_copy()
        self.rb = gper.PrioritizedReplayBuffer(
            cfg.buffer_size, replay_spec(self.obs_width), instances=agents,
            alpha=[c.alpha for c in cfgs], beta=[c.beta for c in cfgs],
            sampling=cfg.sampling, weight_norm=cfg.weight_norm, device=device, backend=cfg.backend, seed=cfg.seed,
            cpu_fallback=False,  # the networks stay where they are: a replay on the CPU would not serve them
        )  # fmt: skip
        # the population's own kernels (Adam, the layers' bias-and-ReLU pass) follow the replay's back
        # end, as the single agent's fused step does: torch where Triton is asked off or its probe failed
        self.kernels = self.rb.backend if cfg.backend == "auto" else cfg.backend
        self.qnet.kernels = self.target.kernels = self.kernels
        forced = fused_learn is True  # the fused kernels on the CPU too (the Triton interpreter: tests)
        self.adam = PopulationAdam(
            list(self.qnet.parameters()),
            lr=[c.learning_rate for c in cfgs],
            eps=cfg.adam_eps,
            capturable=cuda or forced,
            reference="fused" if cfg.fused_step else "torch",
            backend=("triton" if forced else "auto") if self.kernels == "triton" else "torch",
        )
        self.obs = obs.to(device)  # [N, E, obs_width]
        self.next_obs = torch.zeros_like(self.obs)
        self.counters = torch.zeros(2, dtype=torch.float64, device=device)  # env steps (each agent's), train steps
        self.sums = torch.zeros(agents, N_SUMS, dtype=torch.float64, device=device)
        self.beta_t = torch.tensor([c.beta for c in cfgs], dtype=torch.float32, device=device)
        self.total_train_steps = max(1, total_train_steps)
        # each agent's beta anneal step, as the single agent adds it (a float rounded to float32)
        self._beta_step = torch.tensor(
            [(1.0 - c.beta) / self.total_train_steps for c in cfgs], dtype=torch.float32, device=device
        )
        self._per_agent = PerAgent.of(cfgs, device)
        tau = self._per_agent.tau  # the fused step reads a list of rates from the device, made here
        self._tau = float(tau) if isinstance(tau, (int, float)) else torch.tensor(tau, device=device)
        self.batched = not self.exact
        self.fused_collect = self._fused_collect_applies(fused_collect)
        self.episodes = EpisodeTracker(
            agents * cfg.num_envs, device, autoreset=env0.autoreset, agents=agents,
            kernels="triton" if self.fused_collect else "torch",
        )  # fmt: skip
        graphs = cfg.cuda_graphs and cuda
        collect = self._collect_fused if self.fused_collect else self._collect
        self.collect = PhasedStep({"collect": collect}, device, graphs and env0.graph_safe, warmup=3)
        self.learn_state = LearnState()  # the single agent's, each tensor with the agents along dim 0
        self.fused_learn = self._fused_learn_applies(fused_learn)
        if self.fused_learn:  # one kernel for fwd_bwd and adam; the priority update reads its TD errors
            self.learn_state.td = torch.zeros(agents, cfg.batch_size, device=device)
            phases = {"per_sample": self._sample, "upload": self._upload, "learn": self._learn_fused}
            phases["per_update"] = self._per_update
            concurrent: tuple[str, ...] = ()
        else:
            phases = {
                "per_sample": self._sample,
                "upload": self._upload,
                "fwd_bwd": self._fwd_bwd,
                "per_update": self._per_update,
                "adam": self._adam,
            }
            concurrent = ("per_update",)
        self.learn = PhasedStep(phases, device, graphs, state=self.learn_state, concurrent=concurrent)

    def _fused_learn_applies(self, asked: bool | None) -> bool:
        cfg = self.cfg
        holds = fused_learn_supported(self.obs_width, cfg.hidden, self.n_actions)
        if asked is None:
            return (
                holds and cfg.fused_step and self.kernels == "triton" and self.device.type == "cuda"
                and cfg.precision in ("tf32", "fp32") and self.adam.fused
            )  # fmt: skip
        if asked and not (holds and self.adam.fused):
            raise ValueError(
                f"fused_learn needs two hidden layers of at most {MAX_WIDTH} units (got {cfg.hidden}, "
                f"{self.obs_width} inputs, {self.n_actions} actions) and the population's Triton kernels"
            )
        return bool(asked)

    def _fused_collect_applies(self, asked: bool | None) -> bool:
        cfg = self.cfg
        holds = self.batched and fused_act_supported(self.obs_width, cfg.hidden, self.n_actions)
        if asked is None:
            return (
                holds and cfg.fused_step and self.kernels == "triton" and self.device.type == "cuda"
                and cfg.precision != "bf16"
            )  # fmt: skip
        if asked and not (holds and self.kernels == "triton"):
            raise ValueError(
                f"fused_collect needs a batched population (exact=False), the population's Triton kernels and a "
                f"network of two hidden layers the act kernel holds (got {cfg.hidden}, {self.obs_width} inputs, "
                f"{self.n_actions} actions)"
            )
        return bool(asked)

    def _start(self, cfgs: list[Config], device: torch.device, make_env: EnvFactory):
        """The environment blocks, each agent's starting network and the first observations [N, E, W]."""
        cfg, n = cfgs[0], len(cfgs)
        if self.exact:
            blocks, nets, obs = [], [], []
            for i, own in enumerate(cfgs):  # each agent as its single run starts, then its generator's state kept
                env, net, first = single_run_start(own, own.seed, device, make_env)
                blocks.append(EnvBlock(env, i, 1, torch.get_rng_state()))
                nets.append(net)
                obs.append(first)
            return blocks, nets, torch.stack(obs)
        torch.manual_seed(cfg.seed)
        if device.type == "cuda":
            torch.cuda.manual_seed(cfg.seed)
        env = make_env(dataclasses.replace(cfg, num_envs=n * cfg.num_envs), device)
        width = padded_width(env.obs_dim)
        nets = [QNetwork(width, env.n_actions, cfg.hidden) for _ in range(n)]
        first = F.pad(env.reset(seed=cfg.seed), (0, width - env.obs_dim))
        return [EnvBlock(env, 0, n)], nets, first.view(n, cfg.num_envs, width)

    # ---- collect: one env step of every environment of every agent

    def epsilon(self, env_steps: torch.Tensor | float) -> torch.Tensor:
        """Each agent's exploration rate after ``env_steps`` (each agent's count), [N] float64, as the
        single agent computes its own: linear from eps_start to eps_end, then flat."""
        a = self._per_agent
        frac = (torch.as_tensor(env_steps, dtype=torch.float64, device=a.decay.device) / a.decay).clamp(max=1.0)
        return a.eps_start + a.eps_span * frac

    def _collect(self) -> None:
        e, d, shape = self.num_envs, self.obs_dim, (self.agents, self.num_envs)
        with torch.no_grad():
            greedy = self.qnet(self.obs, self.batched).argmax(dim=2)  # [N, E]
        eps = self.epsilon(self.counters[0])
        actions, steps = [], []
        for block in self.blocks:
            n = block.agents * e
            rates = (
                eps[block.first]
                if block.agents == 1
                else eps[block.first : block.first + block.agents].repeat_interleave(e)
            )
            with block.drawing():  # the single agent's draws, in its order
                explore = torch.rand(n, device=self.device) < rates
                random_action = torch.randint(0, self.n_actions, (n,), device=self.device)
                agents_greedy = greedy[block.first : block.first + block.agents].reshape(n)
                actions.append(torch.where(explore, random_action, agents_greedy))
                steps.append(block.env.step(actions[-1]))
        joined = {name: torch.cat([getattr(s, name) for s in steps]) for name in ("obs", "next_obs", "reward")}
        term = torch.cat([s.terminated for s in steps]).view(shape)
        trunc = torch.cat([s.truncated for s in steps]).view(shape)
        reward = joined["reward"].view(shape)
        self.next_obs[:, :, :d] = joined["next_obs"].view(*shape, d)
        # only termination stops bootstrapping: a truncated step's next_obs is the final observation
        self.rb.add({
            "obs": self.obs, "next_obs": self.next_obs, "action": torch.cat(actions).view(shape),
            "reward": reward, "done": term.to(torch.float32),
        })  # fmt: skip
        self.counters[0] += e
        self.episodes.record(reward.reshape(-1), (term | trunc).reshape(-1), self.counters[0])
        self.obs[:, :, :d] = joined["obs"].view(*shape, d)

    def _collect_fused(self) -> None:
        # _collect's step in a dozen launches: one draw for every coin, the actions in one kernel,
        # the environments' step (one kernel where the environment has it), the replay's add, one
        # kernel for the episode records
        e, d, shape, a = self.num_envs, self.obs_dim, (self.agents, self.num_envs), self._per_agent
        draws = torch.rand(self.agents, e, 2, device=self.device)
        precision = "tf32" if self.cfg.precision == "tf32" else "ieee"
        params = [p.detach() for p in self.qnet.parameters()]
        actions = epsilon_greedy(
            params, self.obs, draws, self.counters[0], a.eps_start, a.eps_span, a.decay, precision=precision
        )
        step = self.blocks[0].env.step(actions.view(-1))
        self.next_obs[:, :, :d] = step.next_obs.view(*shape, d)
        self.rb.add({
            "obs": self.obs, "next_obs": self.next_obs, "action": actions, "reward": step.reward.view(shape),
            "done": step.terminated.view(shape).to(torch.float32),
        })  # fmt: skip
        self.counters[0] += e
        self.episodes.record(step.reward, step.terminated | step.truncated, self.counters[0])
        self.obs[:, :, :d] = step.obs.view(*shape, d)

    # ---- learn: the five phases of one training step of every agent

    def _sample(self) -> None:
        self.learn_state.batch = self.rb.sample(self.cfg.batch_size, beta=self.beta_t)

    def _upload(self) -> None:
        s, batch = self.learn_state, self.learn_state.batch
        s.x, s.next_x, s.action = batch["obs"], batch["next_obs"], batch["action"]
        s.reward, s.done, s.weights = batch["reward"], batch["done"], batch.weights

    def _fwd_bwd(self) -> None:
        s, cfg = self.learn_state, self.cfg
        self.adam.zero_grad()
        total, _, s.td = population_loss(
            self.qnet, self.target, s.x, s.next_x, s.action, s.reward, s.done, s.weights,
            gamma=self._per_agent.gamma, double_q=cfg.double_q, sums=self.sums, batched=self.batched, loss=cfg.loss,
        )  # fmt: skip
        total.backward()
        s.grads = [p.grad for p in self.qnet.parameters()]

    def _learn_fused(self) -> None:
        # _fwd_bwd and _adam in two launches (three with clipping): the same loss, clipping, Adam and
        # soft target update
        s, cfg, adam = self.learn_state, self.cfg, self.adam
        x, next_x = s.x, s.next_x
        if next_x.stride() != x.stride() or x.stride(2) != 1:
            x, next_x = x.contiguous(), next_x.contiguous()
        population_learn_step(
            list(self.qnet.parameters()), list(self.target.parameters()), adam.exp_avgs, adam.exp_avg_sqs,
            adam.steps, adam.device_lr, x, next_x, s.action, s.reward, s.done, s.weights.contiguous(), self.sums, s.td,
            gamma=self._per_agent.gamma, double_q=cfg.double_q, max_grad_norm=cfg.max_grad_norm,
            soft_tau=self._tau if cfg.tau < 1.0 else None, beta1=adam.beta1, beta2=adam.beta2, eps=adam.eps,
            precision="tf32" if cfg.precision == "tf32" and self.device.type == "cuda" else "ieee", loss=cfg.loss,
        )  # fmt: skip
        self.counters[1] += 1

    def _per_update(self) -> None:
        if self.rb.sampling != "uniform":  # uniform sampling reads no priority (the single agent's rule)
            self.rb.update_priorities(self.learn_state.batch, self.learn_state.td)
        self.beta_t.add_(self._beta_step).clamp_(max=1.0)

    def _adam(self) -> None:
        cfg, grads = self.cfg, self.learn_state.grads
        if self.adam.fused:  # the clipping's scale, the step and the soft target update in one kernel a tensor
            scale = clip_scales(grads, cfg.max_grad_norm)[0] if cfg.max_grad_norm > 0 else None
            targets = list(self.target.parameters()) if cfg.tau < 1.0 else None
            self.adam.step(grad_scale=scale, targets=targets, tau=self._tau)
        else:
            if cfg.max_grad_norm > 0:
                clip_grad_norms_(grads, cfg.max_grad_norm, batched=self.batched)
            self.adam.step()
            if cfg.tau < 1.0:
                soft_update_(self.target, self.qnet, self._per_agent.tau)
        self.counters[1] += 1

    def update_target(self, train_step: int) -> None:
        """The hard target update due after training step ``train_step`` (tau = 1), as the single agent's."""
        if self.target_update_due(train_step):
            hard_update_(self.target, self.qnet)

    def target_update_due(self, train_step: int) -> bool:
        """Whether a hard target update follows training step ``train_step`` (the host's schedule)."""
        return self.cfg.tau >= 1.0 and train_step % self.cfg.target_every == 0

    # ---- what the trainer core drives (gper.training.Learner)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions for ``obs`` [N * n, obs_dim]: rows ``[i * n, (i + 1) * n)`` are agent
        ``i``'s (the evaluation's copies, :class:`gper.training.evaluation.Evaluator`); [N * n] actions."""
        if obs.dim() != 2 or obs.shape[0] % self.agents:
            raise ValueError(
                f"greedy() takes [N * n, obs_dim] observations, n for each of the {self.agents} agents; "
                f"got shape {tuple(obs.shape)}"
            )
        x = F.pad(obs, (0, self.obs_width - obs.shape[1])).view(self.agents, -1, self.obs_width)
        with torch.no_grad():
            return self.qnet(x, self.batched).argmax(dim=2).reshape(-1)

    def collect_step(self, timer: PhaseTimer | None) -> None:
        self.collect.run(timer)

    def learn_step(self, train_step: int, timer: PhaseTimer | None) -> None:
        self.learn.run(timer)
        self.update_target(train_step)

    def device_values(self) -> dict[str, torch.Tensor]:
        return {"beta": self.beta_t}

    def after_sync(self) -> None:
        if self.cfg.sampling == "rank":
            self.rb.stats()
            self.rb.refresh_ranks()

    def charts(self, host: dict[str, torch.Tensor], env_step: int) -> dict[str, float]:
        """The epoch's exploration rate and beta, the mean over the agents."""
        return {"charts/epsilon": float(self.epsilon(env_step).mean()), "charts/beta": float(host["beta"].mean())}

    def honour_settings(self) -> None:
        """After a checkpoint was loaded: Adam runs at this run's learning rates."""
        self.adam.set_lr([c.learning_rate for c in self.cfgs])

    # ---- checkpoint

    def state_dict(self, *, replay: bool = True) -> dict[str, Any]:
        """Networks, Adam's state, counters, sums, beta, episodes, observations, every block's
        environment and generator state, and with ``replay`` the replay's (tensors, not copies)."""
        adam = self.adam
        state = {
            "agents": self.agents,
            "qnet": self.qnet.state_dict(),
            "target": self.target.state_dict(),
            "adam": {"steps": adam.steps, "exp_avgs": adam.exp_avgs, "exp_avg_sqs": adam.exp_avg_sqs},
            "counters": self.counters,
            "sums": self.sums,
            "beta": self.beta_t,
            "episodes": self.episodes.state_dict(),
            "obs": self.obs,
            "env": [b.env.state_dict() for b in self.blocks],
            "rng": [b.rng for b in self.blocks],
        }
        if replay:
            state["replay"] = self.rb.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], *, replay: bool = True) -> None:
        """Restore :meth:`state_dict` in place (with ``replay``, the replay too)."""
        if state.get("agents") != self.agents or len(state.get("env", ())) != len(self.blocks):
            raise ValueError(
                f"this checkpoint holds a population of {state.get('agents')} agents, not {self.agents} "
                f"({len(state.get('env', ()))} environment blocks, not {len(self.blocks)})"
            )
        self.qnet.load_state_dict(state["qnet"])
        self.target.load_state_dict(state["target"])
        with torch.no_grad():
            self.adam.steps.copy_(state["adam"]["steps"])
            torch._foreach_copy_(self.adam.exp_avgs, list(state["adam"]["exp_avgs"]))
            torch._foreach_copy_(self.adam.exp_avg_sqs, list(state["adam"]["exp_avg_sqs"]))
        if replay:
            self.rb.load_state_dict(state["replay"])
        self.counters.copy_(state["counters"])
        self.sums.copy_(state["sums"])
        self.beta_t.copy_(state["beta"])
        self.episodes.load_state_dict(state["episodes"])
        stateless = False
        for block, env_state, rng in zip(self.blocks, state["env"], state["rng"], strict=True):
            if env_state:
                block.env.load_state_dict(env_state)
            else:
                stateless = True
            block.rng = None if rng is None else rng.clone()
        if stateless:
            self.episodes.restart()
        else:
            self.obs.copy_(state["obs"])

"""DQN with prioritized replay, with the whole loop on the GPU (read top to bottom, like CleanRL's ``dqn.py``).

    gper train                                   # cartpole, built-in defaults, GPU if there is one
    gper train --env market --seed 3             # the futures-style task on synthetic prices
    gper train --env gym:LunarLander-v3          # any Gymnasium id with discrete actions (CPU env)

    from gper.dqn import Config, train
    results = train(Config(env="cartpole", total_steps=100_000))

What runs where, on a GPU:

- **collect** (one CUDA graph when the environment allows it): Q-network forward on the current
  observations, epsilon-greedy actions (epsilon computed on the device from a device step
  counter), environment step, :meth:`~gper.PrioritizedReplayBuffer.add`, episode bookkeeping.
- **learn** (one CUDA graph): ``per_sample`` (draw, gather, IS weights with beta annealed on the
  device) -> ``upload`` (the batch as network inputs) -> ``fwd_bwd`` (double-Q targets, Huber loss
  times IS weights, backward) -> ``adam`` (capturable Adam, soft target update) -> ``per_update``
  (priorities from the TD errors; loss and TD statistics summed on the device).
- once an epoch: the sums and finished episodes are copied to pinned host memory and read (the
  epoch's one synchronisation), one line of per-phase GPU times is printed, metrics are written.

Every ``time_every``-th step runs phase by phase (one graph per phase) with CUDA events between
the phases; the other steps replay the whole step as one graph. On the CPU the same code runs
eagerly and the phase times are host times.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

import gper
from gper.envs import VecEnv, make_env
from gper.training.episodes import EpisodeTracker
from gper.training.phases import PhasedStep
from gper.training.readback import AsyncReadback
from gper.training.runlog import RunLog, plot_run
from gper.training.timing import PHASE_ORDER, PhaseTimer, format_phase_line


@dataclass
class Config:
    """Settings of one training run; ``None`` means the environment's preset (:data:`PRESETS`),
    smaller on the CPU."""

    env: str = "cartpole"
    """environment: cartpole, market, or gym:<ID> (a Gymnasium id with discrete actions, stepped on the CPU)"""
    data: str | None = None
    """market: CSV of bars (timestamp, open, high, low, close, volume); default synthetic prices"""
    seed: int = 1
    """seed of torch, the environments and the replay buffer"""
    total_steps: int | None = None
    """environment steps to train for (all environments together)"""
    num_envs: int | None = None
    """environments stepped together"""
    device: str = "auto"
    """cuda, cuda:N, cpu, or auto (the GPU if there is one and the replay fits, else the CPU)"""
    backend: Literal["auto", "triton", "torch"] = "auto"
    """replay kernels: triton on CUDA, torch on the CPU, when auto"""
    hidden: tuple[int, ...] | None = None
    """hidden layer sizes of the Q-network (the user's network: 512 512)"""
    buffer_size: int | None = None
    """replay capacity in transitions"""
    batch_size: int | None = None
    """transitions per training step"""
    learning_rate: float | None = None
    """Adam's learning rate"""
    max_grad_norm: float | None = None
    """clip the gradient's global norm to this before each Adam step (0: no clipping)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float | None = None
    """target network: 1.0 copies the online network every target_every training steps; below 1,
    a soft update with this rate after every training step"""
    target_every: int | None = None
    """training steps between hard target updates (tau = 1)"""
    double_q: bool = True
    """double-Q targets: the online network picks the next action, the target network values it"""
    sampling: Literal["proportional", "stratified", "rank", "uniform"] = "proportional"
    """replay sampling; uniform turns prioritization off (IS weights all 1); rank re-sorts once an epoch"""
    alpha: float = 0.6
    """priority exponent"""
    beta: float = 0.4
    """IS-weight exponent at the start, annealed linearly to 1 at the last training step"""
    eps_start: float = 1.0
    """epsilon-greedy: exploration rate at the start"""
    eps_end: float | None = None
    """epsilon-greedy: final exploration rate"""
    exploration_fraction: float | None = None
    """fraction of total_steps over which epsilon decays linearly to eps_end"""
    learning_starts: int | None = None
    """environment steps of pure collection before training starts"""
    train_every: int = 1
    """collection steps (of num_envs env steps each) per training step"""
    precision: Literal["tf32", "fp32", "bf16"] = "tf32"
    """matmul precision on CUDA: TF32 tensor cores, full FP32, or bf16 autocast"""
    cuda_graphs: bool = True
    """replay the collection and training steps from CUDA graphs"""
    time_every: int = 10
    """time every N-th step phase by phase with CUDA events (0: no phase timing)"""
    epoch_steps: int | None = None
    """environment steps per epoch (one readback, one timing line, one metrics flush)"""
    run_dir: str = "runs"
    """folder under which each run gets its own folder"""
    run_name: str | None = None
    """the run's folder name (default: <env>__s<seed>__<time>)"""
    save: bool = True
    """write checkpoint.pt (network, optimizer, replay, counters) at the end"""
    resume: str | None = None
    """checkpoint.pt to continue from (same settings); trains on up to total_steps"""
    progress: bool = True
    """show a progress bar"""
    solve_return: float | None = None
    """report when the mean return of the last 100 episodes first reaches this (cartpole: 475)"""
    episode_len: int = 256
    """market: bars per training episode"""
    bars: int | None = None
    """market, synthetic prices: bars to train on"""
    test_bars: int | None = None
    """market, synthetic prices: bars of the held-out test series the greedy policy is scored on"""
    cost_bps: float = 1.0
    """market: transaction cost in basis points of the traded position"""


# per environment, then per device type: the defaults that None stands for
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cartpole": {
        "cuda": dict(
            total_steps=300_000,  # H200: 5 of 5 seeds reached 475 within it; 5 of 6 within 200k
            num_envs=4,
            hidden=(256, 256),
            buffer_size=100_000,
            batch_size=256,
            learning_rate=5e-4,
            max_grad_norm=10.0,
            tau=1.0,
            target_every=200,
            eps_end=0.01,
            exploration_fraction=0.1,
            learning_starts=5_000,
            epoch_steps=10_000,
            solve_return=475.0,
        ),
        # cartpole is small: the same on the CPU, but shorter (3 of 3 seeds reached 475 within 200k there)
        "cpu": dict(total_steps=200_000),
    },
    "market": {
        "cuda": dict(
            total_steps=2_000_000,
            num_envs=256,
            hidden=(512, 512),
            buffer_size=2**21,
            batch_size=4096,
            learning_rate=1e-4,
            max_grad_norm=0.0,
            tau=0.005,
            target_every=1,
            eps_end=0.05,
            exploration_fraction=0.3,
            learning_starts=50_000,
            epoch_steps=100_000,
            solve_return=None,
            bars=400_000,
            test_bars=50_000,
        ),
        "cpu": dict(
            total_steps=300_000,
            num_envs=16,
            hidden=(128, 128),
            buffer_size=2**17,
            batch_size=256,
            learning_starts=10_000,
            epoch_steps=20_000,
            bars=100_000,
            test_bars=20_000,
        ),
    },
    "gym": {
        "cuda": dict(
            total_steps=500_000,
            num_envs=4,
            hidden=(256, 256),
            buffer_size=200_000,
            batch_size=128,
            learning_rate=2.5e-4,
            max_grad_norm=10.0,
            tau=1.0,
            target_every=500,
            eps_end=0.05,
            exploration_fraction=0.2,
            learning_starts=10_000,
            epoch_steps=10_000,
            solve_return=None,
        ),
        "cpu": {},
    },
}


def pick_device(request: str) -> torch.device:
    """``auto`` -> the current CUDA device when there is one, else the CPU."""
    if request == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(request)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {request!r} asked for, but torch sees no CUDA GPU")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve(config: Config, device: torch.device) -> Config:
    """``config`` with every ``None`` replaced by the preset of its environment on ``device``."""
    family = "gym" if config.env.startswith("gym:") else config.env
    if family not in PRESETS:
        raise ValueError(f"unknown environment {config.env!r}: expected cartpole, market or gym:<ID>")
    preset = dict(PRESETS[family]["cuda"])
    if device.type != "cuda":
        preset.update(PRESETS[family]["cpu"])
    filled = {
        f.name: preset[f.name]
        for f in dataclasses.fields(config)
        if getattr(config, f.name) is None and f.name in preset
    }
    cfg = dataclasses.replace(config, **filled)
    cfg.hidden = tuple(int(h) for h in cfg.hidden)
    _check(cfg)
    return cfg


def _check(cfg: Config) -> None:
    positive = ("total_steps", "num_envs", "buffer_size", "batch_size", "target_every", "train_every", "epoch_steps")
    for name in positive:
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not cfg.hidden or any(h < 1 for h in cfg.hidden):
        raise ValueError(f"hidden must be one or more sizes >= 1, got {cfg.hidden!r}")
    for name, low, high in (("gamma", 0, 1), ("tau", 0, 1), ("eps_start", 0, 1), ("eps_end", 0, 1)):
        value = getattr(cfg, name)
        if not low <= value <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    if cfg.tau == 0:
        raise ValueError("tau must be > 0 (1.0 for hard target updates)")
    if not 0 < cfg.exploration_fraction <= 1:
        raise ValueError(f"exploration_fraction must be in (0, 1], got {cfg.exploration_fraction}")
    if cfg.max_grad_norm < 0:
        raise ValueError(f"max_grad_norm must be >= 0, got {cfg.max_grad_norm}")
    if cfg.learning_rate <= 0:
        raise ValueError(f"learning_rate must be > 0, got {cfg.learning_rate}")
    if cfg.learning_starts < cfg.batch_size or cfg.learning_starts < 0:
        raise ValueError(f"learning_starts ({cfg.learning_starts}) must be >= batch_size ({cfg.batch_size})")
    if cfg.time_every < 0:
        raise ValueError(f"time_every must be >= 0, got {cfg.time_every}")


# ---------------------------------------------------------------------------------------- network


class QNetwork(nn.Module):
    """An MLP from observations to one Q-value per action, ReLU between layers."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]  # in place: one pass less over memory
            width = h
        layers.append(nn.Linear(width, n_actions))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def padded_width(obs_dim: int) -> int:
    """Observation width the agent stores and learns from: ``obs_dim`` rounded up to 4 floats.

    The extra inputs are always 0, so the network computes the same function class, but every row
    of the replay then starts ``obs`` and ``next_obs`` 16-byte aligned: a sampled batch feeds the
    first layer as a strided view, without a copy, and cuBLAS takes its aligned kernels (51 -> 52
    measured 21 us faster per step at batch 16384, ``train-step-variants-nvidia-h200-*.md``)."""
    return -(-obs_dim // 4) * 4


def replay_spec(obs_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The fields of one transition in the replay buffer (``obs_dim``: the padded width)."""
    return {
        "obs": ((obs_dim,), torch.float32),
        "next_obs": ((obs_dim,), torch.float32),
        "action": ((), torch.int64),
        "reward": ((), torch.float32),
        "done": ((), torch.float32),
    }


# ---------------------------------------------------------------------------------------- agent


class Agent:
    """Networks, optimizer, replay and the two steps (collect, learn) built from them.

    The device counters ``counters = [env steps, training steps]`` and the device scalar ``beta_t``
    drive epsilon and beta, so the captured steps need nothing from the host. The device sums
    ``sums = [loss, mean q, mean |td|]`` over training steps are read once an epoch.
    """

    def __init__(self, cfg: Config, env: VecEnv, rb: gper.PrioritizedReplayBuffer, total_train_steps: int) -> None:
        self.cfg, self.env, self.rb = cfg, env, rb
        device = self.device = env.device
        cuda = device.type == "cuda"
        self.obs_width = padded_width(env.obs_dim)
        self.qnet = QNetwork(self.obs_width, env.n_actions, cfg.hidden).to(device)
        self.target = copy.deepcopy(self.qnet).requires_grad_(False)
        self.optimizer = torch.optim.Adam(
            self.qnet.parameters(), lr=cfg.learning_rate, capturable=cuda, fused=True if cuda else None
        )
        self.counters = torch.zeros(2, dtype=torch.float64, device=device)
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)
        self.beta_t = torch.full((), cfg.beta, dtype=torch.float32, device=device)
        self.episodes = EpisodeTracker(env.num_envs, device)
        # observations padded with zero columns to obs_width (see padded_width)
        self.obs = self.pad(env.reset(seed=cfg.seed))
        self.next_obs = torch.zeros_like(self.obs)
        self.total_train_steps = max(1, total_train_steps)
        self.autocast = cuda and cfg.precision == "bf16"
        graphs = cfg.cuda_graphs and cuda
        self.collect = PhasedStep({"collect": self._collect}, device, graphs and env.graph_safe)
        self.s = SimpleNamespace()  # what the learning phases pass each other
        learn = {
            "per_sample": self._sample,
            "upload": self._upload,
            "fwd_bwd": self._fwd_bwd,
            "per_update": self._per_update,
            "adam": self._adam,
        }
        # the priority update needs only the TD errors: in the one-graph step it runs alongside Adam
        self.learn = PhasedStep(learn, device, graphs, state=self.s, concurrent=("per_update",))

    def pad(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` [n, obs_dim] with zero columns up to ``obs_width`` (a new tensor)."""
        return F.pad(obs, (0, self.obs_width - obs.shape[1]))

    # ---- collect: one env step of every environment, into the replay buffer

    def epsilon(self, env_steps: torch.Tensor | float) -> torch.Tensor | float:
        """Exploration rate after ``env_steps``: linear from eps_start to eps_end, then flat.
        Works on the device counter (inside the collect graph) and on a host number alike."""
        cfg = self.cfg
        frac = env_steps / (cfg.exploration_fraction * cfg.total_steps)
        frac = frac.clamp(max=1.0) if isinstance(frac, torch.Tensor) else min(frac, 1.0)
        return cfg.eps_start + (cfg.eps_end - cfg.eps_start) * frac

    def _collect(self) -> None:
        env, n = self.env, self.env.num_envs
        with torch.no_grad():
            greedy = self.qnet(self.obs).argmax(dim=1)
        explore = torch.rand(n, device=self.device) < self.epsilon(self.counters[0])
        random_action = torch.randint(0, env.n_actions, (n,), device=self.device)
        action = torch.where(explore, random_action, greedy)
        step = env.step(action)
        done = step.terminated.to(torch.float32)
        d = env.obs_dim
        self.next_obs[:, :d] = step.next_obs
        self.rb.add({"obs": self.obs, "next_obs": self.next_obs, "action": action, "reward": step.reward, "done": done})
        self.counters[0] += n
        self.episodes.record(step.reward.to(torch.float64), step.terminated | step.truncated, self.counters[0])
        self.obs[:, :d] = step.obs

    # ---- learn: the five phases of one training step

    def _sample(self) -> None:
        self.s.batch = self.rb.sample(self.cfg.batch_size, beta=self.beta_t)

    def _upload(self) -> None:
        # the batch's fields as the learner reads them: strided views of the sampled rows (obs
        # and next_obs start 16-byte aligned, so the matmuls read them in place): no kernel
        b, s = self.s.batch, self.s
        s.x, s.next_x = b["obs"], b["next_obs"]
        s.action, s.reward, s.done, s.weights = b["action"], b["reward"], b["done"], b.weights

    def _fwd_bwd(self) -> None:
        s, cfg = self.s, self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            q = self.qnet(s.x).float().gather(1, s.action.unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                next_target = self.target(s.next_x).float()
                if cfg.double_q:
                    next_action = self.qnet(s.next_x).argmax(dim=1, keepdim=True)
                    next_q = next_target.gather(1, next_action).squeeze(1)
                else:
                    next_q = next_target.max(dim=1).values
                y = s.reward + cfg.gamma * (1.0 - s.done) * next_q
        loss = (F.huber_loss(q, y, reduction="none", delta=1.0) * s.weights).mean()
        loss.backward()
        # only detached values outlive the step: a kept autograd graph would hold AccumulateGrad
        # nodes of an earlier step, whose stream then no longer matches a capture's
        s.td = (q - y).detach()
        self.sums += torch.stack((loss.detach(), q.detach().mean(), s.td.abs().mean()))
        # the adam phase reads these: a phase-by-phase capture must keep them alive (see PhasedStep)
        s.grads = [p.grad for p in self.qnet.parameters()]

    def _adam(self) -> None:
        if self.cfg.max_grad_norm > 0:  # tensor ops only (no .item()): capturable
            nn.utils.clip_grad_norm_(self.qnet.parameters(), self.cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        self.counters[1] += 1
        if self.cfg.tau < 1.0:
            with torch.no_grad():
                torch._foreach_lerp_(list(self.target.parameters()), list(self.qnet.parameters()), self.cfg.tau)

    def _per_update(self) -> None:
        s = self.s
        self.rb.update_priorities(s.batch, s.td)
        # anneal in place (two tiny kernels) rather than recomputing from the step counter
        self.beta_t.add_((1.0 - self.cfg.beta) / self.total_train_steps).clamp_(max=1.0)

    def sync_target(self) -> None:
        """Hard target update (tau = 1): copy the online network's parameters. Device work only."""
        with torch.no_grad():
            torch._foreach_copy_(list(self.target.parameters()), list(self.qnet.parameters()))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions for ``obs`` (evaluation)."""
        with torch.no_grad():
            return self.qnet(self.pad(obs)).argmax(dim=1)

    # ---- checkpoint

    def state_dict(self) -> dict[str, Any]:
        return {
            "qnet": self.qnet.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.rb.state_dict(),
            "counters": self.counters,
            "sums": self.sums,
            "beta": self.beta_t,
            "episodes": self.episodes.state_dict(),
            "obs": self.obs,
            "env": self.env.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.qnet.load_state_dict(state["qnet"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rb.load_state_dict(state["replay"])
        self.counters.copy_(state["counters"])
        self.sums.copy_(state["sums"])
        self.beta_t.copy_(state["beta"])
        self.episodes.load_state_dict(state["episodes"])
        self.obs.copy_(state["obs"])
        self.env.load_state_dict(state["env"])


# ---------------------------------------------------------------------------------------- loop


@dataclass
class Results:
    """What :func:`train` returns (also written to the run folder's ``summary.json``)."""

    run_dir: str
    device: str
    env_steps: int
    train_steps: int
    wall_s: float
    episodes: int
    mean_return_last100: float
    best_mean_return_last100: float | None
    solved_at_step: int | None
    """first env step at which the mean of the last 100 episodes reached ``solve_return``"""
    solved_at_s: float | None
    """wall seconds from the start to the end of the epoch in which it was reached"""
    phase_ms: dict[str, float]
    """mean ms per phase over the last epoch that was timed"""
    evaluation: dict[str, float] | None = None
    """market: greedy test P&L on held-out prices against buy-and-hold and flat"""
    notes: list[str] = dataclasses.field(default_factory=list)


def trains_at(cfg: Config, iteration: int) -> bool:
    """Whether collection iteration ``iteration`` (0-based) is followed by a training step."""
    start = math.ceil(cfg.learning_starts / cfg.num_envs)
    return iteration >= start and (iteration - start) % cfg.train_every == 0


def plan_steps(cfg: Config) -> tuple[int, int]:
    """(collection iterations, training steps) of a run: the host knows both without asking the GPU."""
    iterations = math.ceil(cfg.total_steps / cfg.num_envs)
    return iterations, sum(trains_at(cfg, it) for it in range(iterations))


def build_env(cfg: Config, device: torch.device, split: str = "train") -> VecEnv:
    # the device environments draw from torch's default generator (seeded in train): a CUDA
    # graph capture handles that one by itself, so replays draw fresh numbers
    kwargs: dict[str, Any] = {"graph_safe_rng": True} if not cfg.env.startswith("gym:") else {}
    if cfg.env == "market":
        kwargs.update(data=cfg.data, split=split, episode_len=cfg.episode_len, cost_bps=cfg.cost_bps)
        if cfg.data is None:
            kwargs.update(n_bars=cfg.bars, test_bars=cfg.test_bars)
    elif cfg.data is not None:
        raise ValueError("--data is for the market environment only")
    return make_env(cfg.env, cfg.num_envs, device, seed=cfg.seed, **kwargs)


def build_replay(cfg: Config, obs_dim: int, device: torch.device) -> gper.PrioritizedReplayBuffer:
    """The replay buffer; on CUDA it falls back to the CPU by itself when the GPU lacks the memory."""
    return gper.PrioritizedReplayBuffer(
        cfg.buffer_size,
        replay_spec(obs_dim),
        alpha=cfg.alpha,
        beta=cfg.beta,
        sampling=cfg.sampling,
        device=device,
        backend=cfg.backend,
        seed=cfg.seed,
    )


def setup(config: Config, log: Any = print) -> tuple[Config, Agent, list[str]]:
    """The resolved settings, the agent (networks, optimizer, replay, environments) and notes on the device."""
    device = pick_device(config.device)
    notes: list[str] = []
    if device.type == "cpu":
        notes.append("no CUDA GPU: training on the CPU with the CPU presets (smaller sizes, no CUDA graphs)")
    cfg = resolve(config, device)
    torch.manual_seed(cfg.seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(cfg.seed)
    env = build_env(cfg, device)
    rb = build_replay(cfg, padded_width(env.obs_dim), device)
    if rb.device != device:  # the replay did not fit on the GPU: everything moves to the CPU
        notes.append(
            f"not enough GPU memory for a replay of {rb.nbytes_estimate / 2**30:.1f} GiB: "
            "training on the CPU with the CPU presets"
        )
        del rb
        device = torch.device("cpu")
        cfg = resolve(dataclasses.replace(config, device="cpu"), device)
        env.close()
        env = build_env(cfg, device)
        rb = build_replay(cfg, padded_width(env.obs_dim), device)
    for note in notes:
        log(f"gper train: {note}")
    iterations, total_train = plan_steps(cfg)
    return cfg, Agent(cfg, env, rb, total_train), notes


def train(config: Config, log: Any = print) -> Results:
    """Train a DQN agent as ``config`` says; write the run folder; return the :class:`Results`.

    ``log`` receives the human-readable lines (the progress bar's ``write`` in the command).
    """
    cfg, agent, notes = setup(config, log)
    device = agent.device
    iterations, _ = plan_steps(cfg)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_name = cfg.run_name or f"{cfg.env.replace(':', '_').replace('/', '_')}__s{cfg.seed}__{stamp}"
    runlog = RunLog(Path(cfg.run_dir) / run_name)
    runlog.write_json("config.json", {**dataclasses.asdict(cfg), "device": str(device), "gper": gper.__version__})
    start_it, returns = 0, []
    if cfg.resume:
        state = torch.load(cfg.resume, map_location=device, weights_only=False)
        agent.load_state_dict(state["agent"])
        start_it, returns = int(state["iteration"]), list(state["returns"])
        log(f"gper train: resumed from {cfg.resume} at env step {start_it * cfg.num_envs}")
    return _loop(cfg, agent, runlog, iterations, start_it, returns, notes, log)


def _loop(
    cfg: Config,
    agent: Agent,
    runlog: RunLog,
    iterations: int,
    start_it: int,
    returns: list[float],
    notes: list[str],
    log: Any,
) -> Results:
    device, n = agent.device, cfg.num_envs
    epoch_its = max(1, cfg.epoch_steps // n)
    timer = PhaseTimer(device)
    readback = AsyncReadback({"sums": agent.sums, "beta": agent.beta_t, **agent.episodes.snapshot()})
    best = -math.inf
    solved_at: tuple[int, float] | None = None
    last_phase: dict[str, float] = {}
    bar = _progress(cfg, iterations * n, start_it * n)
    t0 = t_epoch = time.perf_counter()
    host_train = sum(trains_at(cfg, it) for it in range(start_it))
    prev_sums, prev_train = agent.sums.cpu(), host_train
    epoch_start_it = start_it
    it = start_it
    while it < iterations:
        timed = cfg.time_every > 0 and it % cfg.time_every == 0
        agent.collect.run(timer if timed else None)
        if trains_at(cfg, it):
            agent.learn.run(timer if timed else None)
            host_train += 1
            if cfg.tau >= 1.0 and host_train % cfg.target_every == 0:
                agent.sync_target()
        it += 1
        if bar is not None and it % 64 == 0:
            bar.update(64 * n)
        if (it - epoch_start_it) % epoch_its and it < iterations:
            continue
        # ---- epoch end: the only synchronisation with the device
        readback.start()
        host = readback.wait()
        now = time.perf_counter()
        wall, t_epoch = now - t_epoch, now
        if cfg.sampling == "rank":
            # ranks are re-sorted here, at the epoch's sync: the buffer's own schedule counts host
            # calls, which graph replays are not; stats() refreshes its count of stored items
            agent.rb.stats()
            agent.rb.refresh_ranks()
        episodes, lost = agent.episodes.drain(host)
        if lost:
            log(f"gper train: {lost} finished episodes were not recorded (more than the ring holds in one epoch)")
        env_step = it * n
        for ret, length, step in episodes:
            returns.append(ret)
            runlog.log(step, **{"charts/episodic_return": ret, "charts/episodic_length": length})
        last100 = sum(returns[-100:]) / len(returns[-100:]) if returns else float("nan")
        # every 100-episode window that ends in this epoch: the best one, and the first at solve_return
        first_new = len(returns) - len(episodes)
        for k in range(max(100, first_new + 1), len(returns) + 1):
            window = sum(returns[k - 100 : k]) / 100
            best = max(best, window)
            if solved_at is None and cfg.solve_return is not None and window >= cfg.solve_return:
                solved_at = (episodes[k - 1 - first_new][2], now - t0)
        sums = host["sums"].clone()
        delta = sums - prev_sums
        prev_sums = sums
        steps_in_epoch = it - epoch_start_it
        epoch_start_it = it
        phases = timer.summary()
        if phases:
            last_phase = {name: ms for name, (ms, _) in phases.items()}
        trained, prev_train = host_train - prev_train, host_train
        metrics = {
            "charts/SPS": steps_in_epoch * n / wall,
            "charts/train_steps_per_s": trained / wall,
            "charts/epsilon": float(agent.epsilon(env_step)),
            "charts/beta": float(host["beta"]),
            "charts/mean_return_last100": last100,
        }
        if trained:
            metrics.update(
                {
                    "losses/td_loss": float(delta[0] / trained),
                    "losses/q_values": float(delta[1] / trained),
                    "losses/abs_td": float(delta[2] / trained),
                }
            )
        metrics.update({f"timing/{name}_ms": ms for name, (ms, _) in phases.items()})
        runlog.log(env_step, **metrics)
        runlog.flush()
        busy = _busy_fraction(phases, steps_in_epoch, trained, wall, device.type == "cuda")
        log(format_phase_line(phases, device))
        log(
            f"step {env_step:>9d}  return(last100) {last100:8.2f}  episodes {len(returns):6d}  "
            f"env steps/s {metrics['charts/SPS']:9.0f}  train steps/s {metrics['charts/train_steps_per_s']:8.0f}  "
            f"wall {now - t0:7.1f}s" + (f"  busy {busy:.0%}" if busy is not None else "")
        )
        if bar is not None:
            bar.update(env_step - bar.n)
            bar.set_postfix(ret=f"{last100:.1f}", sps=f"{metrics['charts/SPS']:.0f}")
    if bar is not None:
        bar.close()
    wall_total = time.perf_counter() - t0
    if cfg.save:
        torch.save(
            {
                "agent": agent.state_dict(),
                "iteration": iterations,
                "returns": returns,
                "config": dataclasses.asdict(cfg),
            },
            runlog.folder / "checkpoint.pt",
        )
    evaluation = _evaluate(cfg, agent, log) if cfg.env == "market" else None
    results = Results(
        run_dir=str(runlog.folder),
        device=str(device),
        env_steps=iterations * n,
        train_steps=host_train,
        wall_s=wall_total,
        episodes=len(returns),
        mean_return_last100=sum(returns[-100:]) / len(returns[-100:]) if returns else float("nan"),
        best_mean_return_last100=best if returns and best > -math.inf else None,
        solved_at_step=solved_at[0] if solved_at else None,
        solved_at_s=solved_at[1] if solved_at else None,
        phase_ms=last_phase,
        evaluation=evaluation,
        notes=notes,
    )
    runlog.write_json("summary.json", dataclasses.asdict(results))
    runlog.close()
    plot_run(runlog.metrics_path, runlog.folder / "plot.png", title=cfg.env)
    return results


def _busy_fraction(
    phases: dict[str, tuple[float, int]], collects: int, trains: int, wall: float, cuda: bool
) -> float | None:
    """Mean GPU phase times times step counts over the epoch's wall time: how busy the GPU was."""
    if "collect" not in phases or wall <= 0 or not cuda:
        return None
    learn = sum(phases[name][0] for name in PHASE_ORDER if name in phases)
    return (phases["collect"][0] * collects + learn * trains) / 1e3 / wall


def _progress(cfg: Config, total: int, initial: int):
    if not cfg.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, desc=f"gper train {cfg.env}")


def _evaluate(cfg: Config, agent: Agent, log: Any) -> dict[str, float]:
    """Market: the greedy policy on held-out prices, against buy-and-hold and flat."""
    from gper.envs.market import evaluate

    test_env = build_env(dataclasses.replace(cfg, num_envs=1), agent.device, split="test")
    result = evaluate(agent.greedy, test_env)
    log(
        f"market test on held-out prices ({result['bars']} bars): greedy policy log P&L "
        f"{result['total_log_pnl']:+.4f} (Sharpe/bar {result['sharpe_per_bar']:+.4f}), buy-and-hold "
        f"{result['buy_and_hold_log_pnl']:+.4f}, flat {result['flat_log_pnl']:+.4f}"
    )
    return result

"""The Q-network and the :class:`Agent`: networks, optimizer, replay and the two steps built from them."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import gper
from gper.dqn.config import Config
from gper.envs import VecEnv
from gper.training.episodes import EpisodeTracker
from gper.training.phases import PhasedStep

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

"""The :class:`Agent`: networks, optimizer, replay and the two steps built from them.

The learn step runs five phases in this order, each a method of the agent; :class:`LearnState`
holds what they pass each other:

    per_sample -> upload -> fwd_bwd [-> grad_sync] -> per_update -> adam

- ``per_sample``: a batch from the batch source (by default drawn from the replay with the
  annealed beta: draw, gather, IS weights).
- ``upload``: the batch's fields as the network's inputs (strided views of the sampled rows).
- ``fwd_bwd``: double-Q targets, Huber (or squared, ``loss``) loss times IS weights, backward; the loss
  sums on the device.
  The target is the replay feed's (:mod:`gper.dqn.replay_feed`): ``r + gamma (1 - done) Q'(s')``
  from the flat replay, the n-step ``R + discount Q'(s_m)`` from the trajectory replay.
- ``grad_sync`` (data-parallel training only, :mod:`gper.training.parallel`): the gradients averaged
  over the ranks, one all-reduce.
- ``per_update``: priorities from the TD errors (none under uniform sampling, which reads none),
  then the beta anneal. In the one-graph step it
  runs on a side stream alongside ``adam`` (neither reads what the other writes).
- ``adam``: optional global-norm clipping, capturable Adam, the soft target update (tau < 1).

With ``fused_step`` (:class:`~gper.dqn.Config`) ``fwd_bwd`` and ``adam`` compute the same with
fewer passes over memory: the hidden layers as GEMMs with a ReLU epilogue
(:meth:`~gper.dqn.network.QNetwork.fused_forward`), the loss in one kernel
(:func:`~gper.dqn.fused_loss.td_loss`), the two forwards on the next observations on a second
stream while the online forward runs (CUDA), and Adam with the soft target update in one kernel
per parameter tensor (:func:`~gper.dqn.fused_adam.adam_step`).

The hard target update (tau = 1) runs from the host loop between steps: :meth:`Agent.update_target`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import gper
from gper.dqn.batch_source import Batch, BatchSource, LearningOnly
from gper.dqn.config import Config
from gper.dqn.fused_act import epsilon_greedy, fused_act_supported
from gper.dqn.fused_adam import adam_state, adam_step, load_adam_state, share_step_counts
from gper.dqn.fused_loss import elementwise_loss, td_loss
from gper.dqn.learn_state import LearnState
from gper.dqn.network import QNetwork, padded_width
from gper.dqn.population_fused_learn import adam_learn_step, fused_learn_supported
from gper.dqn.replay_feed import FlatFeed, Replay, replay_feed
from gper.dqn.sweep import PerAgent
from gper.envs import GoalEnv, VecEnv
from gper.training.episodes import EpisodeTracker
from gper.training.phases import PhasedStep
from gper.training.timing import PhaseTimer

#: slots of :attr:`Agent.sums`, the float64 sums over training steps that fwd_bwd adds to
SUM_LOSS, SUM_Q, SUM_ABS_TD = 0, 1, 2
N_SUMS = 3


# ---------------------------------------------------------------------------------------- agent


class Agent:
    """Networks, optimizer, replay and the two steps (collect, learn) built from them.

    The device counters ``counters = [env steps, training steps]`` and the device scalar ``beta_t``
    drive epsilon and beta, so the captured steps need nothing from the host. The device sums
    ``sums`` (slots ``SUM_LOSS``, ``SUM_Q``, ``SUM_ABS_TD``: loss, mean Q, mean |TD|) over training
    steps are read once an epoch.

    Args:
        cfg: resolved settings (:func:`gper.dqn.resolve`).
        env: the environments the collect step steps.
        rb: the replay the collect step adds to: a :class:`gper.PrioritizedReplayBuffer` (one
            transition a row, 1-step targets; not for an environment whose ``autoreset`` is
            ``next-step``) or a :class:`gper.TrajectoryReplayBuffer` (each environment's steps in
            order, ``cfg.n_step``-step targets; its ``num_envs`` is the environment's and its
            ``window`` at least ``cfg.n_step``). The steps see it through its :attr:`feed`
            (:func:`gper.dqn.replay_feed.replay_feed`), the one replay interface of the learner.
        total_train_steps: training steps of the run; beta reaches 1 at the last one.
        batch_source: where each learn step's batch comes from; default :meth:`sample_replay`.
            With another source the per_update phase anneals beta but updates no priorities: its
            batch is not a draw from the replay.
        grad_sync: data-parallel training (:mod:`gper.training.parallel`): a phase ``grad_sync`` after
            ``fwd_bwd`` calls it with the online network's gradients, which it averages in place
            over the ranks. ``rb`` is then a :class:`~gper.distributed.ShardedPrioritizedReplayBuffer`.
        env_seed: the seed of the environments' first reset (default ``cfg.seed``; each rank its own).
        fused_collect: choose the actions in one kernel and record the episodes in one
            (:meth:`fused_collect_applies`); None (default): where it applies; True on the CPU (with
            ``backend="triton"``) runs them under the Triton interpreter (tests).
        fused_learn: the learn step's forwards, loss, backward, clipping, Adam and soft target update
            in two kernels, three with clipping (:meth:`fused_learn_applies`); None (default): where it
            applies; True on the CPU (with ``backend="triton"``) runs them under the Triton interpreter (tests).
    """

    def __init__(
        self,
        cfg: Config,
        env: VecEnv,
        rb: Replay,
        total_train_steps: int,
        batch_source: BatchSource | None = None,
        grad_sync: Callable[[list[torch.Tensor | None]], None] | None = None,
        env_seed: int | None = None,
        fused_collect: bool | None = None,
        fused_learn: bool | None = None,
    ) -> None:
        # the replay as the learner sees it: the steps below use only this, whichever buffer it is
        self.feed = replay_feed(cfg, env, rb, collects=not isinstance(env, LearningOnly))
        self.cfg, self.env, self.rb = cfg, env, rb
        device = self.device = env.device
        cuda = device.type == "cuda"
        self.obs_width = padded_width(env.obs_dim)
        self.qnet = QNetwork(self.obs_width, env.n_actions, cfg.hidden).to(device)
        self.target = copy.deepcopy(self.qnet).requires_grad_(False)
        self.optimizer = torch.optim.Adam(
            self.qnet.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps, capturable=cuda, fused=cuda or None
        )
        self.counters = torch.zeros(2, dtype=torch.float64, device=device)
        self.sums = torch.zeros(N_SUMS, dtype=torch.float64, device=device)
        self.beta_t = torch.full((), cfg.beta, dtype=torch.float32, device=device)
        # the fused step's kernels follow the replay's back end (auto: what the replay chose, so a
        # GPU where the Triton probe failed, or a machine without Triton, runs the torch kernels)
        self.fused_backend = rb.backend if cfg.backend == "auto" else cfg.backend
        self.fused_collect = self.fused_collect_applies(env) if fused_collect is None else bool(fused_collect)
        if self.fused_collect and not self.fused_collect_applies(env, device_type=None):
            raise ValueError(
                f"fused_collect needs the Triton kernels and a network of two hidden layers the act kernel holds (got "
                f"hidden={cfg.hidden}, {self.obs_width} inputs, {env.n_actions} actions, backend {self.fused_backend})"
            )
        self.episodes = EpisodeTracker(
            env.num_envs, device, autoreset=env.autoreset, kernels="triton" if self.fused_collect else "torch"
        )
        self._schedule = PerAgent.of([cfg], device)  # the exploration schedule as the act kernel reads it
        # observations padded with zero columns to obs_width (see padded_width)
        self.obs = self.pad(env.reset(seed=cfg.seed if env_seed is None else env_seed))
        self.next_obs = torch.zeros_like(self.obs)
        self.total_train_steps = max(1, total_train_steps)
        self.autocast = cuda and cfg.precision == "bf16"
        # where the fused step runs the forwards on the next observations (CUDA only)
        self._side = torch.cuda.Stream(device) if cfg.fused_step and cuda else None
        self.batch_source: BatchSource = self.sample_replay if batch_source is None else batch_source
        self.from_replay = batch_source is None
        # uniform sampling never reads a priority: the TD errors would be written for nothing (the
        # replay's own mode decides, as it may differ from the settings' for a replay built elsewhere)
        self.updates_priorities = self.from_replay and getattr(rb, "sampling", cfg.sampling) != "uniform"
        graphs = cfg.cuda_graphs and cuda
        warmup = self.feed.collect_warmup
        self.collect = PhasedStep({"collect": self._collect}, device, graphs and env.graph_safe, warmup=warmup)
        self.learn_state = LearnState()
        self.fused_learn = self.fused_learn_applies(grad_sync) if fused_learn is None else bool(fused_learn)
        if self.fused_learn and not self.fused_learn_applies(grad_sync, device_type=None):
            raise ValueError(
                "fused_learn needs the Triton kernels, fused_step, TF32 or FP32, the flat replay, one process and a "
                f"network of two hidden layers of at most 128 units (got hidden={cfg.hidden})"
            )
        if self.fused_learn:  # fwd_bwd and adam as one phase of two or three kernels (a population of one)
            self._lr = torch.tensor([cfg.learning_rate], dtype=torch.float64, device=device)
            share_step_counts(self.optimizer)
            self.learn_state.td = torch.zeros(cfg.batch_size, device=device)
            learn = {"per_sample": self._sample, "upload": self._upload, "learn": self._learn_fused}
            learn["per_update"] = self._per_update
        else:
            learn = {
                "per_sample": self._sample,
                "upload": self._upload,
                "fwd_bwd": self._fwd_bwd_fused if cfg.fused_step else self._fwd_bwd,
            }
            if grad_sync is not None:  # data-parallel: the gradients averaged over the ranks
                learn["grad_sync"] = lambda: grad_sync(self.learn_state.grads)
            learn |= {
                "per_update": self._per_update,
                "adam": self._adam_fused if cfg.fused_step else self._adam,
            }
        # the priority update needs only the TD errors: in the one-graph step it runs alongside Adam
        concurrent = () if self.fused_learn else ("per_update",)
        self.learn = PhasedStep(learn, device, graphs, state=self.learn_state, concurrent=concurrent)

    @classmethod
    def for_learning(
        cls,
        obs_dim: int,
        n_actions: int,
        cfg: Config,
        rb: Replay,
        *,
        total_train_steps: int,
        batch_source: BatchSource | None = None,
    ) -> Agent:
        """An agent that only learns, on ``rb.device``: a network from ``obs_dim`` (padded, see
        :func:`padded_width`) inputs to ``n_actions`` Q-values, and no environment (its collect step
        raises). For benchmarks and tests of the learn step."""
        return cls(cfg, LearningOnly(obs_dim, n_actions, rb.device), rb, total_train_steps, batch_source)

    @property
    def trajectory(self) -> bool:
        """Whether the replay is a :class:`gper.TrajectoryReplayBuffer` (n-step targets). Reports and
        tests read it; the steps do not: they see the replay through :attr:`feed` alone."""
        return isinstance(self.rb, gper.TrajectoryReplayBuffer)

    @property
    def goal_env(self) -> GoalEnv | None:
        """The goal task whose observations the replay holds in parts (hindsight relabelling), or None."""
        return self.feed.goal_env

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

    def fused_collect_applies(self, env: VecEnv, device_type: str | None = "cuda") -> bool:
        """Whether the collect step chooses its actions in one kernel (:mod:`gper.dqn.fused_act`) and
        records episodes in one (:mod:`gper.training.episodes_kernel`): on CUDA (``device_type``;
        None: any device) with the Triton kernels and ``fused_step``, a network of two hidden layers
        the kernel holds, and not in bf16 (whose forward runs under autocast)."""
        cfg = self.cfg
        return (
            device_type in (None, self.device.type) and self.fused_backend == "triton" and cfg.fused_step
            and cfg.precision != "bf16" and not isinstance(env, LearningOnly)
            and fused_act_supported(self.obs_width, cfg.hidden, env.n_actions)
        )  # fmt: skip

    def _actions(self) -> torch.Tensor:
        """Epsilon-greedy actions for ``obs`` [N]: the network's greedy ones, a random one where a coin
        with the exploration rate comes up."""
        n = self.env.num_envs
        if self.fused_collect:  # the forward, argmax, rate and coins in one launch (one draw of [1, n, 2])
            draws = torch.rand(1, n, 2, device=self.device)
            params = [p.detach().unsqueeze(0) for p in self.qnet.parameters()]
            precision = "tf32" if self.cfg.precision == "tf32" else "ieee"
            a = self._schedule
            return epsilon_greedy(
                params, self.obs.unsqueeze(0), draws, self.counters[0], a.eps_start, a.eps_span, a.decay,
                precision=precision,
            ).view(n)  # fmt: skip
        with torch.no_grad():
            greedy = self.qnet(self.obs).argmax(dim=1)
        explore = torch.rand(n, device=self.device) < self.epsilon(self.counters[0])
        random_action = torch.randint(0, self.env.n_actions, (n,), device=self.device)
        return torch.where(explore, random_action, greedy)

    def _collect(self) -> None:
        env, n = self.env, self.env.num_envs
        action = self._actions()
        step = env.step(action)
        d = env.obs_dim
        self.next_obs[:, :d] = step.next_obs
        self.feed.add(self.obs, action, step, self.next_obs)
        self.counters[0] += n
        self.episodes.record(step.reward, step.terminated | step.truncated, self.counters[0])
        self.obs[:, :d] = step.obs

    # ---- learn: the five phases of one training step, in the order they run

    def sample_replay(self) -> Batch:
        """The default batch source: ``batch_size`` transitions drawn from the replay with the annealed
        beta; from the trajectory replay, ``n_step``-step transitions discounted by ``gamma``."""
        return self.feed.sample(self.cfg.batch_size, self.beta_t)

    def _sample(self) -> None:
        self.learn_state.batch = self.batch_source()

    def _upload(self) -> None:
        # the batch's fields as the learner reads them: strided views of the sampled rows (obs
        # and next_obs start 16-byte aligned, so the matmuls read them in place): no kernel, except
        # a goal task's input, the observation and desired goal joined (GoalTrajectoryFeed)
        self.feed.upload(self.learn_state.batch, self.learn_state)

    def _fwd_bwd(self) -> None:
        s, cfg = self.learn_state, self.cfg
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
                y = self.feed.target(s, next_q)
        loss = (elementwise_loss(q, y, cfg.loss) * s.weights).mean()
        loss.backward()
        # only detached values outlive the step: a kept autograd graph would hold AccumulateGrad
        # nodes of an earlier step, whose stream then no longer matches a capture's
        s.td = (q - y).detach()
        self.sums += torch.stack((loss.detach(), q.detach().mean(), s.td.abs().mean()))  # SUM_LOSS, SUM_Q, SUM_ABS_TD
        # the adam phase reads these: a phase-by-phase capture must keep them alive (see PhasedStep)
        s.grads = [p.grad for p in self.qnet.parameters()]

    def _fwd_bwd_fused(self) -> None:
        # _fwd_bwd's update (same targets, loss, TD errors and sums) with fewer passes over memory
        s, cfg = self.learn_state, self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        # autocast's lists do not hold _addmm_activation: under bf16 the plain layers
        online = self.qnet.forward if self.autocast else self.qnet.fused_forward
        target = self.target.forward if self.autocast else self.target.fused_forward
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            side = self._side
            if side is not None:  # forked: in a capture, a parallel branch of the graph
                main = torch.cuda.current_stream(self.device)
                side.wait_stream(main)
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext(), torch.no_grad():
                next_target = target(s.next_x)
                next_online = online(s.next_x) if cfg.double_q else None
            q = online(s.x)
            if side is not None:
                # joined before the loss reads them; any later use of their memory on the side
                # stream comes after a wait on this stream, so after the loss has read them
                main.wait_stream(side)
        discount, gamma = self.feed.loss_discount(s)
        loss, s.td = td_loss(
            q, next_online, next_target, s.action, s.reward, discount, s.weights,
            gamma=gamma, sums=self.sums, backend=self.fused_backend, loss=cfg.loss,
        )  # fmt: skip
        loss.backward()
        s.grads = [p.grad for p in self.qnet.parameters()]

    def fused_learn_applies(self, grad_sync: object = None, device_type: str | None = "cuda") -> bool:
        """Whether the learn step's forwards, loss, backward, clipping, Adam and soft target update run
        as the population's two or three kernels for one agent (:mod:`gper.dqn.population_fused_learn`):
        on CUDA (``device_type``; None: any device) with the Triton kernels and ``fused_step``, at TF32 or
        FP32, from the flat replay (1-step targets), in one process, for a network the kernel holds
        (two hidden layers of up to 128 units)."""
        cfg = self.cfg
        return (
            device_type in (None, self.device.type) and self.fused_backend == "triton" and cfg.fused_step
            and cfg.precision in ("tf32", "fp32") and grad_sync is None and isinstance(self.feed, FlatFeed)
            and fused_learn_supported(self.obs_width, cfg.hidden, self.env.n_actions)
        )  # fmt: skip

    def _learn_fused(self) -> None:
        # _fwd_bwd_fused and _adam_fused in two or three launches: the same loss, targets, clipping, Adam
        # (on the optimizer's own state, so its state_dict stays the checkpoint) and soft update
        s, cfg = self.learn_state, self.cfg
        adam_learn_step(
            list(self.qnet.parameters()), list(self.target.parameters()), self.optimizer, self._lr,
            s.x, s.next_x, s.action, s.reward, s.done, s.weights, self.sums, s.td,
            gamma=cfg.gamma, double_q=cfg.double_q, max_grad_norm=cfg.max_grad_norm,
            soft_tau=cfg.tau if cfg.tau < 1.0 else None, precision="tf32" if cfg.precision == "tf32" else "ieee",
            loss=cfg.loss,
        )  # fmt: skip
        self.counters[1] += 1

    def _per_update(self) -> None:
        s = self.learn_state
        # from another batch source (a fixed batch) there is no priority update: its rows are not
        # the replay's draws; nor under uniform sampling, which reads none. Beta is annealed all the
        # same, so the step keeps its phases
        if self.updates_priorities:
            self.feed.update_priorities(s.batch, s.td)
        # anneal in place (two tiny kernels) rather than recomputing from the step counter
        self.beta_t.add_((1.0 - self.cfg.beta) / self.total_train_steps).clamp_(max=1.0)

    def _adam(self) -> None:
        if self.cfg.max_grad_norm > 0:  # tensor ops only (no .item()): capturable
            nn.utils.clip_grad_norm_(self.qnet.parameters(), self.cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        self.counters[1] += 1
        if self.cfg.tau < 1.0:  # the soft target update, inside the captured step (see update_target)
            with torch.no_grad():
                torch._foreach_lerp_(list(self.target.parameters()), list(self.qnet.parameters()), self.cfg.tau)

    def _adam_fused(self) -> None:
        # _adam's update: the same clipping, then torch.optim.Adam's step on its own state, with
        # the soft target update in the same kernels
        cfg = self.cfg
        if cfg.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(self.qnet.parameters(), cfg.max_grad_norm, foreach=True)
        params, exp_avgs, exp_avg_sqs, steps = adam_state(self.optimizer)
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        soft = cfg.tau < 1.0
        adam_step(
            params, [p.grad for p in params], exp_avgs, exp_avg_sqs, steps,
            lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
            targets=list(self.target.parameters()) if soft else None, tau=cfg.tau, backend=self.fused_backend,
        )  # fmt: skip
        self.counters[1] += 1

    # ---- target network

    def update_target(self, train_step: int) -> None:
        """The target update due after training step ``train_step`` (counted from 1), called by the
        host loop after every learn step. With tau = 1 it copies the online network every
        ``target_every`` steps (device work only: the host knows the count, nothing is read back);
        with tau < 1 it does nothing, because the soft update runs in the learn step's adam phase."""
        if self.target_update_due(train_step):
            self.sync_target()

    def target_update_due(self, train_step: int) -> bool:
        """Whether a hard target update follows training step ``train_step`` (the host's schedule)."""
        return self.cfg.tau >= 1.0 and train_step % self.cfg.target_every == 0

    def sync_target(self) -> None:
        """Hard target update: copy the online network's parameters. Device work only."""
        with torch.no_grad():
            torch._foreach_copy_(list(self.target.parameters()), list(self.qnet.parameters()))

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions for ``obs`` (evaluation)."""
        with torch.no_grad():
            return self.qnet(self.pad(obs)).argmax(dim=1)

    # ---- what the trainer core drives (gper.training.algorithm.Learner)

    def collect_step(self, timer: PhaseTimer | None) -> None:
        """One collection iteration: the collect step (timed into ``timer`` when given)."""
        self.collect.run(timer)

    def learn_step(self, train_step: int, timer: PhaseTimer | None) -> None:
        """Training step ``train_step`` (counted from 1): the learn step, then the target update due after it."""
        self.learn.run(timer)
        self.update_target(train_step)

    def device_values(self) -> dict[str, torch.Tensor]:
        """What the trainer reads back once an epoch besides the sums and episodes: beta."""
        return {"beta": self.beta_t}

    def after_sync(self) -> None:
        """At the epoch's synchronisation, rank sampling re-sorts its ranks: the buffer's own
        schedule counts host calls, which graph replays are not; ``stats()`` first refreshes its
        count of stored items."""
        if self.cfg.sampling == "rank":
            self.rb.stats()
            self.rb.refresh_ranks()

    def charts(self, host: dict[str, torch.Tensor], env_step: int) -> dict[str, float]:
        """The epoch's exploration rate and beta."""
        return {"charts/epsilon": float(self.epsilon(env_step)), "charts/beta": float(host["beta"])}

    def honour_settings(self) -> None:
        """After a checkpoint was loaded: Adam runs at this run's learning rate."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.learning_rate
        if self.fused_learn:
            self._lr.fill_(self.cfg.learning_rate)

    # ---- checkpoint

    def state_dict(self, *, replay: bool = True) -> dict[str, Any]:
        """Networks, optimizer, counters, sums, beta, episodes, observations, the environment's
        state and, with ``replay``, the replay buffer's (the tensors themselves, not copies)."""
        state = {
            "qnet": self.qnet.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "counters": self.counters,
            "sums": self.sums,
            "beta": self.beta_t,
            "episodes": self.episodes.state_dict(),
            "obs": self.obs,
            "env": self.env.state_dict(),
        }
        if replay:
            state["replay"] = self.rb.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], *, replay: bool = True) -> None:
        """Restore :meth:`state_dict` in place (with ``replay``, the replay buffer too).

        An environment that keeps no state (``state_dict()`` empty, such as ``gym:<ID>``) cannot
        continue its episodes: they start afresh from the observations of its reset, and the
        running returns of the episodes that were in flight are dropped. Adam keeps this agent's
        device-dependent flags (capturable, fused, foreach), so a state saved on another device loads."""
        self.qnet.load_state_dict(state["qnet"])
        self.target.load_state_dict(state["target"])
        self._load_optimizer(state["optimizer"])
        if replay:
            self.rb.load_state_dict(state["replay"])
        self.counters.copy_(state["counters"])
        self.sums.copy_(state["sums"])
        self.beta_t.copy_(state["beta"])
        self.episodes.load_state_dict(state["episodes"])
        if state["env"]:
            self.env.load_state_dict(state["env"])
            self.obs.copy_(state["obs"])
        else:
            self.episodes.restart()

    def _load_optimizer(self, state: dict[str, Any]) -> None:
        load_adam_state(self.optimizer, state)
        if self.fused_learn:
            share_step_counts(self.optimizer)

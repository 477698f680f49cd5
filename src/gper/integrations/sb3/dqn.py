"""SB3's DQN trained on prioritized replay (Schaul et al. 2016, arXiv:1511.05952, Algorithm 1).

:class:`PrioritizedDQN` changes SB3's ``DQN.train`` in four places and keeps the rest (target
updates, exploration, gradient clipping, the logger's names):

* the Huber loss of each transition is weighted by its IS weight (:func:`weighted_huber_loss`);
* the drawn transitions' priorities become their TD errors (stale-checked, after the step);
* beta goes linearly from the buffer's starting value to 1 over the run, from SB3's progress;
* the loss is summed on the device; ``train/loss`` is a :class:`DeviceMean` that is read (one
  host sync) when the logger dumps, instead of SB3's ``loss.item()`` at every gradient step.
"""

from __future__ import annotations

import io
import math
import pathlib
from typing import Any

import torch
from stable_baselines3 import DQN
from torch.nn import functional as F

from gper.integrations.sb3.buffer import PrioritizedReplayBuffer

#: DQN's positional arguments after policy and env, up to gradient_steps (replay_buffer_class follows)
_POSITIONAL = (
    "learning_rate",
    "buffer_size",
    "learning_starts",
    "batch_size",
    "tau",
    "gamma",
    "train_freq",
    "gradient_steps",
)


def weighted_huber_loss(current_q: torch.Tensor, target_q: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``mean(weights * smooth_l1(current_q, target_q))``: SB3's DQN loss when every weight is 1.

    Args:
        current_q: [B, 1] Q-values of the actions taken.
        target_q: [B, 1] TD targets.
        weights: [B, 1] IS weights (the shape of ``current_q``; a [B] tensor would broadcast to [B, B]).

    Returns:
        0-d loss.
    """
    if weights.shape != current_q.shape:
        raise ValueError(f"weights have shape {tuple(weights.shape)}, the Q-values {tuple(current_q.shape)}")
    return (weights * F.smooth_l1_loss(current_q, target_q, reduction="none")).mean()


class DeviceMean:
    """A mean of values summed on the device, read when it is first shown.

    SB3's writers print ``str(value)`` (stdout, CSV) or call ``value.item()`` (JSON); the first
    read copies the sum to the host (one sync) and keeps the float. TensorBoard writes only real
    numbers: :meth:`PrioritizedDQN.dump_logs` turns every ``DeviceMean`` into a float before the
    logger dumps, so a ``DeviceMean`` reaches a writer as it is only when something else (an
    ``EvalCallback``, say) dumps the logger, and TensorBoard then leaves it out of that dump.
    """

    shape = ()  # for SB3's JSON writer, which reads values with a dtype through item()

    def __init__(self, total: torch.Tensor, count: int) -> None:
        self._total, self._count = total, count
        self._value: float | None = None
        self.dtype = total.dtype  # kept after the read frees the tensor

    def item(self) -> float:
        if self._value is None:
            self._value = self._total.item() / self._count if self._count else math.nan
            self._total = None  # the device memory can go
        return self._value

    def __float__(self) -> float:
        return self.item()

    def __format__(self, spec: str) -> str:
        return format(self.item(), spec)

    def __str__(self) -> str:
        return str(self.item())

    def __repr__(self) -> str:
        return f"DeviceMean({self.item()!r})" if self._value is not None else f"DeviceMean(<{self._count} on device>)"


class PrioritizedDQN(DQN):
    """SB3's ``DQN`` on :class:`~gper.integrations.sb3.PrioritizedReplayBuffer`, with prioritized replay.

    Takes DQN's arguments. ``replay_buffer_class`` defaults to gper's buffer and must be it (or a
    subclass); its settings go in ``replay_buffer_kwargs`` (``alpha``, ``beta`` (the starting
    value, annealed to 1), ``eps``, ``sampling``, ...). ``n_steps`` must stay 1: gper's buffer
    gives 1-step transitions.

    Logs what SB3's DQN logs, with ``train/loss`` the mean IS-weighted loss of the last
    ``train()`` call, plus ``train/beta``.

    Raises:
        TypeError: a ``replay_buffer_class`` that is not gper's, or arguments after
            ``gradient_steps`` given by position.
        ValueError: ``n_steps`` other than 1.
    """

    replay_buffer: PrioritizedReplayBuffer

    def __init__(self, policy: Any, env: Any, *args: Any, replay_buffer_class: type | None = None, **kwargs: Any):
        if len(args) > len(_POSITIONAL):
            raise TypeError(f"PrioritizedDQN takes {', '.join(_POSITIONAL)} by position; pass the rest by keyword")
        cls = PrioritizedReplayBuffer if replay_buffer_class is None else replay_buffer_class
        if not (isinstance(cls, type) and issubclass(cls, PrioritizedReplayBuffer)):
            raise TypeError(
                f"PrioritizedDQN needs replay_buffer_class=gper.integrations.sb3.PrioritizedReplayBuffer "
                f"(or a subclass), got {replay_buffer_class!r}"
            )
        if kwargs.get("n_steps", 1) != 1:
            raise ValueError(f"PrioritizedDQN gives 1-step returns: n_steps must be 1, got {kwargs['n_steps']!r}")
        super().__init__(policy, env, *args, replay_buffer_class=cls, **kwargs)

    def _setup_model(self) -> None:
        super()._setup_model()
        #: beta at the start of the run (the buffer's, from replay_buffer_kwargs); train() anneals it to 1
        self.beta_start = self.replay_buffer.beta

    def annealed_beta(self) -> float:
        """``beta_start + (1 - beta_start) * progress``, progress from 0 (start) to 1 (the last step)."""
        done = 1.0 - self._current_progress_remaining
        return min(1.0, max(0.0, self.beta_start + (1.0 - self.beta_start) * done))

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """SB3's DQN step, ``gradient_steps`` times, on prioritized batches (see the module docstring)."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        rb = self.replay_buffer
        rb.beta = self.annealed_beta()
        loss_sum = torch.zeros((), device=self.device)
        for _ in range(gradient_steps):
            replay_data = rb.sample(batch_size, env=self._vec_normalize_env)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
            with torch.no_grad():
                next_q_values = self.q_net_target(replay_data.next_observations).max(dim=1).values.reshape(-1, 1)
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values
            q_values = self.q_net(replay_data.observations)
            current_q_values = torch.gather(q_values, dim=1, index=replay_data.actions.long())
            loss = weighted_huber_loss(current_q_values, target_q_values, replay_data.weights)
            loss_sum += loss.detach()

            self.policy.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            # TD errors of the network that was sampled for, as in the PER paper
            rb.update_priorities(replay_data, (target_q_values - current_q_values).detach())

        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", DeviceMean(loss_sum, gradient_steps))
        self.logger.record("train/beta", rb.beta)

    def dump_logs(self) -> None:
        """SB3's ``dump_logs``, with every :class:`DeviceMean` read first (one sync per dump)."""
        values = self.logger.name_to_value
        for key, value in list(values.items()):
            if isinstance(value, DeviceMean):
                values[key] = float(value)
        super().dump_logs()

    def load_replay_buffer(self, path: str | pathlib.Path | io.BufferedIOBase, truncate_last_traj: bool = True) -> None:
        """SB3's ``load_replay_buffer``; a file holding another kind of buffer is refused, and the
        model keeps the buffer it had."""
        previous = self.replay_buffer
        try:
            super().load_replay_buffer(path, truncate_last_traj)
        except BaseException:
            self.replay_buffer = previous
            raise
        if not isinstance(self.replay_buffer, PrioritizedReplayBuffer):
            kind = type(self.replay_buffer).__name__
            self.replay_buffer = previous
            raise TypeError(f"{path} holds a {kind}; PrioritizedDQN needs a gper PrioritizedReplayBuffer")

"""SB3's ``ReplayBuffer`` interface over a :class:`gper.PrioritizedReplayBuffer` on the model's device.

SB3 keeps its transitions in numpy arrays ``[buffer_size, n_envs, ...]`` and draws a step and an
env uniformly; here each ``add`` writes its ``n_envs`` transitions as ``n_envs`` rows of a gper
buffer (one host-to-device copy per field), slot ``step * n_envs + env``, and ``sample`` draws
rows by priority on the device, with importance-sampling weights (Schaul et al. 2016,
arXiv:1511.05952).

``optimize_memory_usage=True`` keeps SB3's semantics on gper's rows. SB3 stores each observation
once: step ``i`` reads its next observation from step ``i + 1``, and its slot ``pos`` holds only
the newest step's next observation (that half-written slot is never drawn). Here the rows hold
``obs`` without ``next_obs`` in a ring of ``buffer_size - 1`` steps, the next observation of row
``s`` is the ``obs`` of row ``s + n_envs``, and the newest step's next observations wait in a
staging tensor (SB3's slot ``pos``), so the same transitions can be drawn as from SB3's buffer.
"""

from __future__ import annotations

import operator
import os
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.vec_env import VecNormalize

import gper
from gper._device import canonical_device
from gper.ops.state import C_SIZE
from gper.replay.checkpoint import PREFIX_TENSORS


class PrioritizedReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` fields, then what prioritized replay adds; all on the buffer's device.

    Attributes:
        observations: [B, *obs_shape], the observation space's dtype.
        actions: [B, action_dim], the action space's dtype (float64 stored as float32, as SB3 does).
        next_observations: [B, *obs_shape].
        dones: [B, 1] float32, ``done * (1 - timeout)`` as in SB3.
        rewards: [B, 1] float32.
        discounts: None (no n-step returns), as SB3's 1-step buffer gives.
        weights: [B, 1] float32 importance-sampling weights, shaped like ``rewards`` so that
            ``weights * elementwise_loss`` of a ``[B, 1]`` loss does not broadcast to ``[B, B]``.
        indices: [B] int64 gper slots drawn (``step * n_envs + env`` in the buffer's ring).
        batch: the :class:`gper.SampledBatch` drawn, for a stale-checked ``update_priorities``.
    """

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor | None
    weights: torch.Tensor
    indices: torch.Tensor
    batch: gper.SampledBatch


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class PrioritizedReplayBuffer(ReplayBuffer):
    """A ``replay_buffer_class`` for SB3's DQN, SAC, TD3 and DDPG, held in a gper buffer on the device.

    Built by SB3 from ``replay_buffer_class=PrioritizedReplayBuffer`` and
    ``replay_buffer_kwargs=dict(alpha=..., beta=...)``; SB3 passes the first seven arguments.
    SAC, TD3 and DDPG only sample from it, so without priority updates their draws stay uniform;
    :class:`~gper.integrations.sb3.PrioritizedDQN` updates them.

    What differs from SB3's ``ReplayBuffer``: there are no numpy arrays (``observations``,
    ``actions``, ...): the data are the rows of :attr:`gper` (``rb.gper.storage``); draws are by
    priority, with replacement, over every stored (step, env) pair; ``sample`` returns
    :class:`PrioritizedReplayBufferSamples` whose tensors may be strided views of the drawn rows.
    ``pos``, ``full`` and ``size()`` count steps as SB3 does.

    Args:
        buffer_size: transitions over all envs; ``buffer_size // n_envs`` steps are kept (at least 1).
        observation_space: a Box, Discrete, MultiDiscrete or MultiBinary space (SB3 uses its
            ``DictReplayBuffer`` for Dict spaces; this buffer refuses them).
        action_space: the action space.
        device: where the rows live (the model's device, which SB3 passes); "auto" as in SB3.
        n_envs: environments stepped together; each ``add`` takes one transition of each.
        optimize_memory_usage: store each observation once (see the module docstring); as in SB3,
            not together with ``handle_timeout_termination``, and it needs two steps or more.
        handle_timeout_termination: store ``infos[i]["TimeLimit.truncated"]`` and give
            ``dones = done * (1 - timeout)``, so a time limit does not cut bootstrapping.
        alpha, beta, eps, sampling, weight_norm, backend, cuda_graphs: as for
            :class:`gper.PrioritizedReplayBuffer`.
        seed: the sampler's Philox key; None draws one from numpy's global generator, which SB3
            seeds with the model's ``seed`` before it builds the buffer.
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: torch.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        sampling: str = "proportional",
        weight_norm: str = "global",
        seed: int | None = None,
        backend: str = "auto",
        cuda_graphs: bool = True,
    ) -> None:
        for name, value in (("buffer_size", buffer_size), ("n_envs", n_envs)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(observation_space, spaces.Dict):
            raise TypeError(
                "PrioritizedReplayBuffer takes Box, Discrete, MultiDiscrete or MultiBinary observations, not Dict"
            )
        if optimize_memory_usage and handle_timeout_termination:
            # SB3's own refusal (its issue 934): a truncated episode would bootstrap from the reset observation
            raise ValueError(
                "ReplayBuffer does not support optimize_memory_usage = True "
                "and handle_timeout_termination = True simultaneously."
            )
        if optimize_memory_usage and buffer_size // n_envs < 2:
            raise ValueError(
                f"optimize_memory_usage needs buffer_size >= 2 * n_envs, got {buffer_size} for {n_envs} envs"
            )
        # SB3's attributes (obs_shape, action_dim, pos, full, n_envs, device) without its arrays
        BaseBuffer.__init__(self, int(buffer_size), observation_space, action_space, device, n_envs=int(n_envs))
        self.buffer_size = max(int(buffer_size) // self.n_envs, 1)
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self._obs_dtype = np.dtype(observation_space.dtype)
        self._action_dtype = np.dtype(self._maybe_cast_dtype(action_space.dtype))
        obs_t = _torch_dtype(self._obs_dtype)
        spec: dict[str, tuple] = {
            "obs": (self.obs_shape, obs_t),
            "action": ((self.action_dim,), _torch_dtype(self._action_dtype)),
            "reward": ((), torch.float32),
            "done": ((), torch.float32),
        }
        if not self.optimize_memory_usage:
            spec["next_obs"] = (self.obs_shape, obs_t)
        if self.handle_timeout_termination:
            spec["timeout"] = ((), torch.float32)
        #: steps in the gper ring: one fewer when memory is optimised (SB3's slot ``pos`` is the staging)
        self._ring_steps = self.buffer_size - 1 if self.optimize_memory_usage else self.buffer_size
        if seed is None:
            seed = int(np.random.randint(0, 2**63 - 1, dtype=np.int64))
        self._kwargs: dict[str, Any] = {
            "capacity": self._ring_steps * self.n_envs,
            "spec": spec,
            "alpha": alpha,
            "beta": beta,
            "eps": eps,
            "sampling": sampling,
            "weight_norm": weight_norm,
            "seed": seed,
            "backend": backend,
            "cuda_graphs": cuda_graphs,
        }
        self._build(self._device)

    # ------------------------------------------------------------------ state

    def _build(self, device: torch.device, state: dict[str, Any] | None = None) -> None:
        """(Re)build the gper buffer and the staging tensor on ``device``, empty or from ``state``."""
        kwargs = self._kwargs | {"backend": self._backend_for(device)}
        #: the gper buffer that holds the rows (read ``stats()``, ``storage``, ``priorities()`` on it)
        # an out-of-memory error is raised, not turned into a CPU buffer under a CUDA model
        self.gper = gper.PrioritizedReplayBuffer(**kwargs, device=device, cpu_fallback=False)
        self._device = self.gper.device
        self._next_obs = None
        if self.optimize_memory_usage:
            self._next_obs = torch.zeros((self.n_envs, *self.obs_shape), dtype=self.gper.spec["obs"][1], device=device)
        if state is None:
            self._ring_pos, self._held = 0, 0
            return
        self.gper.load_state_dict(state["gper"])  # its rows and generations of the filled slots only
        if self._next_obs is not None:
            self._next_obs.copy_(state["next_obs"])

    def _backend_for(self, device: torch.device) -> str:
        # a buffer saved with backend="triton" on a GPU may be loaded on a machine without one
        asked = self._kwargs["backend"]
        if asked == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            return "torch"
        return asked

    def _keep_settings(self) -> None:
        """Take the settings that may have been assigned since construction (beta, annealed) into
        the arguments a rebuild uses: a gper state loads only into a buffer of its own settings."""
        g = self.gper
        self._kwargs |= {"alpha": g.alpha, "beta": g.beta, "eps": g.eps, "weight_norm": g.weight_norm}

    def _gper_state(self) -> dict[str, Any]:
        """The gper buffer's state and the staging tensor, with tensors on the CPU."""
        self._keep_settings()
        state = dict(self.gper.state_dict())
        # the filled slots' rows and generations only (as gper's own files; load_state_dict takes
        # them so): a buffer filled to 1% copies and pickles about 1% of its rows
        filled = int(state["counters"][C_SIZE])  # the device's count: adds replayed from graphs too
        for name in PREFIX_TENSORS:
            state[name] = state[name][:filled]
        # copies on the host (.cpu() of a CPU tensor would return the buffer's own)
        state = {k: v.to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
        return {"gper": state, "next_obs": None if self._next_obs is None else self._next_obs.cpu()}

    @property
    def device(self) -> torch.device:
        """The device the rows live on. Assigning another one (SB3's ``load_replay_buffer`` assigns
        the model's) moves the buffer there: its state, draws included, goes with it."""
        return self._device

    @device.setter
    def device(self, value: torch.device | str) -> None:
        device = canonical_device(value)
        if getattr(self, "gper", None) is not None and device != self.gper.device:
            state = self._gper_state()
            self._build(device, state)
        self._device = device

    def __getstate__(self) -> dict[str, Any]:
        """What SB3's ``save_replay_buffer`` pickles: every attribute, with the gper buffer as its
        state on the CPU (so the file loads on a machine without the GPU it was saved on)."""
        state = self.__dict__.copy()
        state.pop("gper")
        state.pop("_next_obs")
        state["_saved"] = self._gper_state() | {"device": str(self.gper.device)}
        state["_kwargs"] = dict(self._kwargs)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild on the saved device when this process has it, else on the CPU; SB3's
        ``load_replay_buffer`` then assigns the model's device, which moves it if it differs."""
        saved = state.pop("_saved")
        self.__dict__.update(state)
        device = torch.device(saved["device"])
        here = torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()
        if device.type == "cuda" and not here:
            device = torch.device("cpu")
        self._build(device, saved)

    def reset(self) -> None:
        """Empty the buffer (a fresh gper buffer with the current settings and the same seed)."""
        super().reset()
        self._keep_settings()
        self.gper = None  # the old rows go before the new ones are allocated
        self._build(self._device)

    # ------------------------------------------------------------------ settings

    @property
    def beta(self) -> float:
        """The IS exponent ``sample`` uses, in [0, 1]; assignable (``PrioritizedDQN`` anneals it)."""
        return self.gper.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self.gper.beta = value

    @property
    def alpha(self) -> float:
        """The priority exponent, in [0, 1]; assignable."""
        return self.gper.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self.gper.alpha = value

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(buffer_size={self.buffer_size}, n_envs={self.n_envs}, size={self.size()}, "
            f"optimize_memory_usage={self.optimize_memory_usage}, gper={self.gper!r})"
        )

    # ------------------------------------------------------------------ add

    def _array(self, name: str, x: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """``x`` as a C-contiguous array of ``shape`` and ``dtype`` (reshaped as SB3 reshapes), or a ValueError."""
        a = np.asarray(x)
        if a.size != int(np.prod(shape)):
            raise ValueError(f"add(): {name} has shape {a.shape}, expected {shape} for {self.n_envs} envs")
        return np.ascontiguousarray(a.reshape(shape), dtype=dtype)

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one step of every env: ``n_envs`` rows, in one gper ``add`` at the current max priority.

        Args:
            obs: [n_envs, *obs_shape] (Discrete observations are reshaped, as SB3 does).
            next_obs: [n_envs, *obs_shape].
            action: [n_envs, action_dim] after a reshape, as SB3 does.
            reward: [n_envs].
            done: [n_envs].
            infos: n_envs dicts; ``"TimeLimit.truncated"`` is read when handling timeouts.

        Raises:
            ValueError: an array of the wrong size, or ``infos`` of the wrong length; nothing is stored.
        """
        n = self.n_envs
        obs_shape = (n, *self.obs_shape)
        data = {
            "obs": self._array("obs", obs, obs_shape, self._obs_dtype),
            "action": self._array("action", action, (n, self.action_dim), self._action_dtype),
            "reward": self._array("reward", reward, (n,), np.float32),
            "done": self._array("done", done, (n,), np.float32),
        }
        nxt = self._array("next_obs", next_obs, obs_shape, self._obs_dtype)
        if not self.optimize_memory_usage:
            data["next_obs"] = nxt
        if self.handle_timeout_termination:
            if len(infos) != n:
                raise ValueError(f"add(): {len(infos)} infos for {n} envs")
            data["timeout"] = np.array([info.get("TimeLimit.truncated", False) for info in infos], dtype=np.float32)
        # CPU tensors over the arrays: gper copies each field to the device once
        self.gper.add({k: torch.from_numpy(v) for k, v in data.items()})
        if self._next_obs is not None:
            # the newest step's next observations (pageable memory is staged before this returns)
            self._next_obs.copy_(torch.from_numpy(nxt), non_blocking=True)
        self._ring_pos = (self._ring_pos + 1) % self._ring_steps
        self._held = min(self._held + 1, self._ring_steps)
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    # ------------------------------------------------------------------ sample

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> PrioritizedReplayBufferSamples:
        """Draw ``batch_size`` transitions by priority, with IS weights at the buffer's ``beta``.

        On CUDA nothing here waits for the device, except with ``env``: SB3's ``VecNormalize``
        normalises numpy arrays, so the observations and rewards then go through the host.

        Args:
            batch_size: B >= 1.
            env: a ``VecNormalize`` to normalise observations and rewards with, as SB3 does.

        Returns:
            :class:`PrioritizedReplayBufferSamples` on the buffer's device.
        """
        batch = self.gper.sample(batch_size)
        obs, action, reward = batch["obs"], batch["action"], batch["reward"]
        if self.optimize_memory_usage:
            next_obs = self._next_observations(batch.indices)
        else:
            next_obs = batch["next_obs"]
        done = batch["done"]
        if self.handle_timeout_termination:
            done = done * (1.0 - batch["timeout"])  # only dones that are not due to timeouts
        rewards = reward.unsqueeze(1)
        if env is not None:
            obs, next_obs = self._normalize_obs_t(obs, env), self._normalize_obs_t(next_obs, env)
            rewards = torch.as_tensor(self._normalize_reward(rewards.cpu().numpy(), env), device=self.device)
        return PrioritizedReplayBufferSamples(
            obs, action, next_obs, done.unsqueeze(1), rewards, None, batch.weights.unsqueeze(1), batch.indices, batch
        )

    def _normalize_obs_t(self, x: torch.Tensor, env: VecNormalize) -> torch.Tensor:
        return torch.as_tensor(self._normalize_obs(x.cpu().numpy(), env), device=self.device)

    def _next_observations(self, indices: torch.Tensor) -> torch.Tensor:
        """[B, *obs_shape] next observations of rows ``indices`` when memory is optimised: the ``obs``
        of the same env's next step, or the staging tensor for the newest step (whose successor
        has not arrived). Computed on the device from the host's count of adds: no sync."""
        n, ring = self.n_envs, self._ring_steps
        step, env = indices // n, indices % n
        following = self.gper.storage["obs"][((step + 1) % ring) * n + env]
        newest = (self._ring_pos - 1) % ring
        is_newest = (step == newest).view(-1, *([1] * len(self.obs_shape)))
        return torch.where(is_newest, self._next_obs[env], following)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> Any:
        raise NotImplementedError("PrioritizedReplayBuffer draws by priority on the device: call sample()")

    # ------------------------------------------------------------------ priorities

    def update_priorities(
        self, samples: PrioritizedReplayBufferSamples | gper.SampledBatch | torch.Tensor, td_errors: Any
    ) -> None:
        """Set the drawn transitions' priorities to ``(|td| + eps) ** alpha``.

        Args:
            samples: what :meth:`sample` returned (stale-checked: transitions overwritten since,
                or drawn before a ``reset``, a load or a move, are left alone), its ``batch``, or
                raw [B] int64 slots (no such check).
            td_errors: [B] or [B, 1] TD errors (a floating tensor, on the buffer's device to avoid a copy).

        Raises:
            ValueError: td_errors of another shape.
        """
        target = samples.batch if isinstance(samples, PrioritizedReplayBufferSamples) else samples
        td = torch.as_tensor(td_errors).detach()
        if td.dim() == 2 and td.shape[1] == 1:
            td = td[:, 0]
        if td.dim() != 1:
            raise ValueError(f"update_priorities(): td_errors must be [B] or [B, 1], got shape {tuple(td.shape)}")
        self.gper.update_priorities(target, td.to(self.device, non_blocking=True))

    # ------------------------------------------------------------------ SB3's dones

    @property
    def dones(self) -> _StepDones:
        """SB3's ``dones[step]`` for the ``n_envs`` transitions of one step (a [n_envs] float32 view).

        SB3's ``learn()`` sets ``dones[newest step] = True`` to cut the last trajectory of a
        memory-optimised buffer; that assignment writes the stored done flags. Other arrays of
        SB3's buffer (``observations``, ``actions``, ...) do not exist here: read ``gper.storage``.
        """
        return _StepDones(self)

    def _step_rows(self, step: int) -> slice | None:
        """The gper rows of SB3's step index ``step``, or None when no transition of it is held."""
        step = operator.index(step)
        if not 0 <= step < self.buffer_size:
            raise IndexError(f"dones: step {step} out of range [0, {self.buffer_size})")
        age = (self.pos - 1 - step) % self.buffer_size  # 0 for the newest step
        if age >= self._held:
            return None  # never written, or SB3's half-written slot (the staging tensor here)
        ring = (self._ring_pos - 1 - age) % self._ring_steps
        return slice(ring * self.n_envs, (ring + 1) * self.n_envs)


class _StepDones:
    """``rb.dones[step]`` read and written in the gper rows (see :attr:`PrioritizedReplayBuffer.dones`)."""

    def __init__(self, rb: PrioritizedReplayBuffer) -> None:
        self._rb = rb

    def __getitem__(self, step: int) -> torch.Tensor:
        rows = self._rb._step_rows(step)
        if rows is None:
            raise IndexError(f"dones: step {step} holds no transition")
        return self._rb.gper.storage["done"][rows]

    def __setitem__(self, step: int, value: Any) -> None:
        rows = self._rb._step_rows(step)
        if rows is None:
            return  # a step that is never drawn: nothing to mark
        v = np.asarray(value, dtype=np.float32)
        # the done flag is data, not priority: writing it in place leaves the tree and its
        # generations as they are, and sample reads rows when it runs (graphs included)
        self._rb.gper.storage["done"][rows] = float(v) if v.ndim == 0 else torch.from_numpy(v)

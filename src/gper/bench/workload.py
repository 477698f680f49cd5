"""The benchmarks' workloads: the reference transition and the reference streams, their random data.

The reference transition (51-float obs, int64 action, float32 reward, 51-float next_obs, bool
done) is what the flat buffer's benchmarks store, with alpha 0.6, beta 0.4 and eps 1e-6. The
trajectory workload stores the same step once per row (:data:`TRAJ_SPEC`: obs, action, reward)
in ``num_envs`` streams of episodes (:class:`TrajectoryWorkload`, :class:`StreamSteps`), and
samples 1-step and :data:`N_STEP`-step transitions (discount :data:`GAMMA`) and sequences.
Everything is generated on the device, in chunks, so filling 2^25 slots needs no host memory.
The buffers timed on it are in :mod:`gper.bench.peers`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: the reference transition: a 51-float observation, a discrete action, reward, next observation, done
SPEC: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "obs": ((51,), torch.float32),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
    "next_obs": ((51,), torch.float32),
    "done": ((), torch.bool),
}
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
#: TD errors are drawn log-uniformly over these powers of ten (so priorities span 10^3 after alpha)
TD_LOG10_RANGE = (-3.0, 2.0)
#: slots generated per chunk while filling (about 430 MiB of transitions at a time)
FILL_CHUNK = 2**20


def random_transitions(
    n: int, device: torch.device | str, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """``n`` random transitions of :data:`SPEC` on ``device`` (never zeros: they hide bugs)."""
    kw = {"device": device, "generator": generator}
    return {
        "obs": torch.randn(n, 51, **kw),
        "action": torch.randint(0, 18, (n,), **kw),
        "reward": torch.randn(n, **kw),
        "next_obs": torch.randn(n, 51, **kw),
        "done": torch.rand(n, **kw) < 0.05,
    }


def random_td(n: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """[n] float32 TD errors with random signs and log-uniform magnitudes over :data:`TD_LOG10_RANGE`."""
    lo, hi = TD_LOG10_RANGE
    mag = torch.pow(10.0, lo + (hi - lo) * torch.rand(n, device=device, generator=generator))
    sign = torch.randint(0, 2, (n,), device=device, generator=generator) * 2 - 1
    return mag * sign


def format_capacity(n: int) -> str:
    """``2^k`` for powers of two, the plain number otherwise."""
    return f"2^{int(math.log2(n))}" if n > 0 and n & (n - 1) == 0 else str(n)


# ----------------------------------------------------------------------------------------------
# the trajectory workload

#: one step of a stream as the trajectory buffer stores it (next_obs, terminated, truncated come with add)
TRAJ_SPEC: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "obs": ((51,), torch.float32),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
}
#: the n of the n-step ops (``sample-n3``, ``step-n3``) and their discount
N_STEP, GAMMA = 3, 0.99


@dataclass(frozen=True)
class TrajectoryWorkload:
    """The streams a trajectory buffer is filled with, and the sequences sampled from it.

    Attributes:
        num_envs: streams; one ``add`` is one step of every stream (``add-envs`` is timed at this batch).
        window: the trajectory buffer's longest n-step or sequence (``capacity // num_envs >= window + 2``).
        end_prob: probability that a step ends its episode, half terminated, half truncated
            (mean episode length ``1 / end_prob`` steps).
        seq_batch: sequences per ``sample_sequences`` call (``sequences`` is timed at this batch).
        seq_length: steps of a sequence after its burn-in.
        burn_in: steps of a sequence before its start.
    """

    num_envs: int = 256
    window: int = 80
    end_prob: float = 0.01
    seq_batch: int = 256
    seq_length: int = 80
    burn_in: int = 40

    def min_capacity(self) -> int:
        """The smallest capacity whose streams hold a window: ``num_envs * (window + 2)``."""
        return self.num_envs * (self.window + 2)


class StreamSteps:
    """Random steps of ``num_envs`` streams of episodes, as a vectorised environment with Gymnasium's
    same-step autoreset hands them out: a step's ``obs`` is the previous step's ``next_obs`` unless
    the previous step ended its episode, and then it is a fresh first observation.

    Steps come in chunks (:meth:`chunk`), each a dict of ``[k, num_envs, ...]`` tensors on the device
    (``obs``, ``action``, ``reward``, ``next_obs``, ``terminated``, ``truncated``); chunks continue
    one another.
    """

    def __init__(self, w: TrajectoryWorkload, device: torch.device, generator: torch.Generator) -> None:
        self.w, self.device, self.gen = w, device, generator
        self._next_obs: torch.Tensor | None = None  # [E, 51] next_obs of the last step handed out
        self._ended = torch.zeros(w.num_envs, dtype=torch.bool, device=device)  # [E] it ended its episode

    def chunk(self, k: int) -> dict[str, torch.Tensor]:
        """The next ``k`` steps of every stream: a dict of ``[k, num_envs, ...]`` tensors."""
        e, kw = self.w.num_envs, {"device": self.device, "generator": self.gen}
        nxt = torch.randn(k, e, 51, **kw)
        first = torch.randn(k, e, 51, **kw)  # first observations, used where the step before ended
        u = torch.rand(k, e, **kw)
        terminated = u < self.w.end_prob / 2
        truncated = (u >= self.w.end_prob / 2) & (u < self.w.end_prob)
        ended = terminated | truncated
        prev = torch.cat([self._next_obs[None] if self._next_obs is not None else first[:1], nxt[:-1]])
        prev_ended = torch.cat([self._ended[None], ended[:-1]])
        obs = torch.where(prev_ended[..., None], first, prev)
        self._next_obs, self._ended = nxt[-1], ended[-1]
        return {
            "obs": obs,
            "action": torch.randint(0, 18, (k, e), **kw),
            "reward": torch.randn(k, e, **kw),
            "next_obs": nxt,
            "terminated": terminated,
            "truncated": truncated,
        }


def continuing_step(num_envs: int, device: torch.device, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One step of every stream whose ``next_obs`` is its ``obs`` (bit for bit), no episode ending.

    Added again and again, each add continues the episodes of the one before (its ``obs`` is the
    ``next_obs`` the buffer keeps from it): the steady state of ``add``, with one pre-made input that
    a CUDA graph can read in place.
    """
    obs = torch.randn(num_envs, 51, device=device, generator=generator)
    return {
        "obs": obs,
        "action": torch.randint(0, 18, (num_envs,), device=device, generator=generator),
        "reward": torch.randn(num_envs, device=device, generator=generator),
        "next_obs": obs.clone(),
        "terminated": torch.zeros(num_envs, dtype=torch.bool, device=device),
        "truncated": torch.zeros(num_envs, dtype=torch.bool, device=device),
    }


def jax_td_errors(jax, key, n: int):
    """The TD errors of :func:`random_td` drawn in JAX (for the JAX peers, which jit it with ``n`` static)."""
    jnp = jax.numpy
    lo, hi = TD_LOG10_RANGE
    k1, k2 = jax.random.split(key)
    mag = jnp.power(10.0, lo + (hi - lo) * jax.random.uniform(k1, (n,), jnp.float32))
    return mag * jnp.where(jax.random.bernoulli(k2, 0.5, (n,)), 1.0, -1.0).astype(jnp.float32)

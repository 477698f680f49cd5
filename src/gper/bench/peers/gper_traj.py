"""gper's trajectory buffer as a peer: :class:`gper.TrajectoryReplayBuffer` timed on the trajectory workload.

Timing (``gper-traj-triton`` on CUDA, ``gper-traj-torch`` on the CPU): ``num_envs`` streams of
random episodes (:class:`~gper.bench.workload.StreamSteps`), added one step of every stream at a
time until every stream's ring is full, then every drawable start given the priority of a random
TD error. The ops (:data:`~gper.bench.peers.base.TRAJ_OPS`):

* ``sample-n1``: ``rb.sample(B)``: every field (obs, action, reward, next_obs, terminated,
  truncated, discount) and the IS weights;
* ``sample-n3``: ``rb.sample(B, n_step=3, gamma=0.99)``: the same with 3-step returns;
* ``step-n1``, ``step-n3``: that sample, then ``update_priorities`` of what it drew from a [B]
  tensor of TD errors;
* ``add-envs``: one step of every stream (batch ``num_envs``), continuing its episode;
* ``sequences``: ``rb.sample_sequences(seq_batch, seq_length, burn_in)``.

Each is called eagerly and, on CUDA, replayed as one captured graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import gper
from gper.bench.harness import fill
from gper.bench.peers.base import TRAJ_OPS, Peer, Setting, Skip, trajectory_ops_at
from gper.bench.workload import (
    ALPHA,
    BETA,
    EPS,
    FILL_CHUNK,
    GAMMA,
    N_STEP,
    TRAJ_SPEC,
    StreamSteps,
    continuing_step,
    random_td,
)

NAMES = ("gper-traj",)
WHERE_TIME_GOES: dict[str, str] = {}
#: steps generated at a time while filling (a chunk of 256 streams is about 100 MiB)
_STEPS_PER_CHUNK = 1024


def status(name: str, device: torch.device) -> tuple[bool, str]:
    return True, f"torch {torch.__version__}"


def impl_name(backend: str) -> str:
    """``gper-traj-triton`` for the flat buffer's ``backend`` name (``triton`` or ``torch``)."""
    return f"gper-traj-{backend}"


def ops_of(impl: str) -> tuple[str, ...]:
    return TRAJ_OPS


def ops_at(impl: str, b: int, setting: Setting) -> tuple[str, ...]:
    return trajectory_ops_at(TRAJ_OPS, b, setting)


class GperTrajPeer(Peer):
    """A full :class:`~gper.TrajectoryReplayBuffer` of random episodes, its drawable starts at random priorities.

    ``setting.traj`` gives the streams and the window, ``setting.backend`` the kernels,
    ``setting.modes`` how each op is called; the seed seeds the buffer's sampler and the data.
    """

    def __init__(self, capacity: int, setting: Setting) -> None:
        super().__init__(capacity, setting)
        w = self.w = setting.traj
        self.setting = setting
        if capacity % w.num_envs or capacity < w.min_capacity():
            raise Skip(
                f"capacity {capacity:,} does not make {w.num_envs} streams of window + 2 = {w.window + 2} rows "
                f"(needs a multiple of {w.num_envs}, at least {w.min_capacity():,})"
            )
        kwargs = dict(alpha=ALPHA, beta=BETA, eps=EPS, window=w.window, device=setting.device)
        kwargs.update(backend=setting.backend, seed=setting.seed, cpu_fallback=False)
        # out of device memory is recorded, never timed on the host
        self.rb = gper.TrajectoryReplayBuffer(capacity, w.num_envs, TRAJ_SPEC, **kwargs)
        self.impls = (impl_name(self.rb.backend),)
        self.modes = setting.modes
        streams = StreamSteps(w, self.device, self.gen)

        def add(lo: int, hi: int) -> None:
            steps = hi // w.num_envs - lo // w.num_envs
            for s in range(0, steps, _STEPS_PER_CHUNK):
                chunk = streams.chunk(min(_STEPS_PER_CHUNK, steps - s))
                for t in range(next(iter(chunk.values())).shape[0]):
                    self.rb.add({k: v[t] for k, v in chunk.items()})

        # capacity // num_envs steps of every stream: each stream's ring is full (end rows fill it sooner)
        fill(capacity, add, setting.fill_limit_s(), f"filling the trajectory buffer to {capacity:,} slots")
        self.randomize_priorities()

    def randomize_priorities(self) -> None:
        """Give every drawable start the priority of a random TD error (the other slots stay out of the tree).

        In updates of one size (the last one topped up with starts set before it, whose later write
        wins), so the buffer's graph for raw updates is captured once, not once per size.
        """
        starts = self.rb.drawable().nonzero().squeeze(1)
        size = min(FILL_CHUNK, starts.numel())
        for lo in range(0, starts.numel(), size):
            idx = starts[lo : lo + size]
            if idx.numel() < size:
                idx = torch.cat([idx, starts[: size - idx.numel()]])
            self.rb.update_priorities(idx, random_td(size, self.device, self.gen))

    def prepare(self, b: int, first: bool) -> None:
        if not first:
            self.randomize_priorities()
        self.td = random_td(b, self.device, self.gen)
        self.new = continuing_step(self.w.num_envs, self.device, self.gen)

    def ops_at(self, impl: str, b: int) -> tuple[str, ...]:
        return ops_at(impl, b, self.setting)

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        rb, td, new, w = self.rb, self.td, self.new, self.w
        if name == "sample-n1":
            return lambda: rb.sample(b)
        if name == "sample-n3":
            return lambda: rb.sample(b, n_step=N_STEP, gamma=GAMMA)
        if name == "step-n1":
            return lambda: rb.update_priorities(rb.sample(b), td)
        if name == "step-n3":
            return lambda: rb.update_priorities(rb.sample(b, n_step=N_STEP, gamma=GAMMA), td)
        if name == "add-envs":
            return lambda: rb.add(new)
        if name == "sequences":
            return lambda: rb.sample_sequences(b, length=w.seq_length, burn_in=w.burn_in)
        raise ValueError(f"unknown op {name!r}")


def build(impls: tuple[str, ...], capacity: int, setting: Setting) -> GperTrajPeer:
    return GperTrajPeer(capacity, setting)

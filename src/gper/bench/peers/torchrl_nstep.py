"""TorchRL's n-step path as a peer: a replay buffer with ``MultiStepTransform``, timed on the trajectory workload.

What TorchRL offers for n-step DQN is ``torchrl.envs.transforms.MultiStepTransform`` set as the
replay buffer's transform (what its trainer configs expose as ``multi_step``): on ``extend``, it
keeps the last n steps of every stream, turns each step into an n-step transition (the
discounted reward sum, ``("next", "observation")`` n steps ahead, ``gamma``, ``nonterminal``) and
writes that; sampling is then the plain sample of those transitions. The storage is a
``LazyTensorStorage(capacity, ndim=2)`` on the device (streams x time), as in TorchRL's example.

* ``torchrl-nstep``: TorchRL's ``PrioritizedReplayBuffer`` with the transform (its sum tree in
  the compiled extension: skipped where that does not load with the installed torch).
* ``torchrl-nstep-uniform``: ``ReplayBuffer`` with the transform and its default uniform sampler
  (needs no compiled extension; no priorities, so no ``step-n3``).

Ops: ``sample-n3`` (and ``step-n3``, sample then ``update_priority``, for the prioritized one) and
``add-envs`` (``extend`` by one step of every stream, through the transform). There is no 1-step
row: a TorchRL user takes 1-step transitions from a buffer without the transform, which is the
flat workload's ``torchrl-td`` peer. TorchRL and tensordict are imported only when used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gper.bench.harness import fill
from gper.bench.peers.base import Setting, Skip, trajectory_ops_at
from gper.bench.peers.torchrl import TorchRLPrioritized, require_torchrl, sum_tree_status, tree_device, versions
from gper.bench.workload import ALPHA, BETA, EPS, GAMMA, N_STEP, StreamSteps, continuing_step, random_td

NAMES = ("torchrl-nstep", "torchrl-nstep-uniform")
#: the ops each variant is timed on
NSTEP_OPS = {"torchrl-nstep": ("sample-n3", "step-n3", "add-envs"), "torchrl-nstep-uniform": ("sample-n3", "add-envs")}
WHERE_TIME_GOES = {
    "torchrl-nstep": "add: MultiStepTransform concatenates the last n steps with the new one, sums discounted "
    "rewards with a conv1d over one mask per trajectory (their count read with .item(), a sync), gathers the "
    "n-step-ahead next entries, then the writer stores the n-step transition and marks it in the host sum tree; "
    "sample: the flat prioritized sample of stored n-step transitions (host tree, device gather).",
    "torchrl-nstep-uniform": "as torchrl-nstep, sampled uniformly on the device (no tree).",
}
#: steps per extend while filling (the transform's masks are [trajectories, streams, steps])
_STEPS_PER_EXTEND = 256


def status(name: str, device: torch.device) -> tuple[bool, str]:
    """Installed; for ``torchrl-nstep``, also its compiled extension (the sum tree) loads with this torch."""
    try:
        require_torchrl()
    except Skip as e:
        return False, str(e)
    if name == "torchrl-nstep-uniform":
        return True, f"{versions()}, uniform sampler on {device.type}"
    return sum_tree_status(device)


def ops_of(impl: str) -> tuple[str, ...]:
    return NSTEP_OPS[impl]


def ops_at(impl: str, b: int, setting: Setting) -> tuple[str, ...]:
    return trajectory_ops_at(NSTEP_OPS[impl], b, setting)


class TorchRLNStepPeer(TorchRLPrioritized):
    """A TorchRL replay buffer with ``MultiStepTransform(N_STEP, GAMMA)``, filled through the transform.

    Prioritized: TorchRL applies ``(priority + eps) ** alpha`` itself, so it is given ``|td|``.
    """

    def __init__(self, capacity: int, setting: Setting, prioritized: bool) -> None:
        super().__init__(capacity, setting)
        fill_limit_s = setting.fill_limit_s()
        require_torchrl()
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer, ReplayBuffer
        from torchrl.envs.transforms import MultiStepTransform

        w = self.w = setting.traj
        if capacity % w.num_envs:
            raise Skip(f"capacity {capacity} is not a multiple of num_envs {w.num_envs}")
        self.setting, self.prioritized, self.TensorDict = setting, prioritized, TensorDict
        self.impls = ("torchrl-nstep",) if prioritized else ("torchrl-nstep-uniform",)
        device = self.device
        storage = LazyTensorStorage(capacity, ndim=2, device=device)
        transform = MultiStepTransform(n_steps=N_STEP, gamma=GAMMA)
        if prioritized:
            # the tree would follow a CUDA storage and refuse to be built without a CUDA wheel: say where
            tree = tree_device(device)
            self.rb = PrioritizedReplayBuffer(
                alpha=ALPHA, beta=BETA, eps=EPS, storage=storage, transform=transform, sampler_device=tree
            )
        else:
            self.rb = ReplayBuffer(storage=storage, transform=transform)
        streams = StreamSteps(w, device, self.gen)

        def add(lo: int, hi: int) -> None:
            steps = hi // w.num_envs - lo // w.num_envs
            for s in range(0, steps, _STEPS_PER_EXTEND):
                self.rb.extend(self._tensordict(streams.chunk(min(_STEPS_PER_EXTEND, steps - s))))

        fill(capacity, add, fill_limit_s, f"filling TorchRL's n-step buffer to {capacity:,} slots")
        # the transform holds back the last N_STEP steps of every stream until their n steps are known
        self.rb.extend(self._tensordict(streams.chunk(N_STEP)))
        if prioritized:
            self.randomize_priorities()

    def _tensordict(self, steps: dict[str, torch.Tensor]):
        """``[k, E, ...]`` steps as TorchRL's ``[E, k]`` rollout TensorDict (rewards and flags ``[E, k, 1]``)."""
        s = {k: v.transpose(0, 1) for k, v in steps.items()}
        done = s["terminated"] | s["truncated"]
        nxt = {"observation": s["next_obs"], "reward": s["reward"][..., None], "done": done[..., None]}
        nxt.update(terminated=s["terminated"][..., None], truncated=s["truncated"][..., None])
        data = {"observation": s["obs"], "action": s["action"], "next": nxt}
        return self.TensorDict(data, batch_size=s["obs"].shape[:2], device=self.device)

    def prepare(self, b: int, first: bool) -> None:
        if not first and self.prioritized:
            self.randomize_priorities()
        self.td = random_td(b, self.device, self.gen)
        step = continuing_step(self.w.num_envs, self.device, self.gen)
        self.new_td = self._tensordict({k: v[None] for k, v in step.items()})

    def ops_at(self, impl: str, b: int) -> tuple[str, ...]:
        return ops_at(impl, b, self.setting)

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        rb, td = self.rb, self.td
        if name == "add-envs":
            return lambda: rb.extend(self.new_td)
        if name == "sample-n3":
            return (lambda: self._sample(b)) if self.prioritized else (lambda: rb.sample(b))
        if name == "step-n3" and self.prioritized:

            def step():
                data, weights, index = self._sample(b)
                rb.update_priority(index, td.abs())
                return data, weights

            return step
        raise ValueError(f"{impl} does not time {name!r}")


def build(impls: tuple[str, ...], capacity: int, setting: Setting) -> TorchRLNStepPeer:
    return TorchRLNStepPeer(capacity, setting, prioritized=impls == ("torchrl-nstep",))

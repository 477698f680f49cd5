"""The device work of a buffer of several instances: one set of launches for all N where the back
end has them (the Triton back end's ``sample_instances``, ``update_instances``,
``add_rows_instances``), else each instance's own kernels in turn (:class:`InstanceKernels`).

Either way instance ``i``'s results are bit for bit those of a single buffer of seed ``seed + i``.
What still goes one instance at a time on the Triton back end: rank mode's updates (each
instance's sort keys are a tensor of its own, written by ``set_keys``) and its refresh, rank mode's
new keys after an add, the add of rows the add kernel cannot write itself, and, on the CPU,
``batch`` weight normalisation (there torch computes a power of a 0-d exponent by another path than
of an [N, 1] one, which may round differently).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gper.ops.instances import batched, beta_vector
from gper.ops.state import S_BETA, SampleOut
from gper.ops.tree import reference
from gper.replay.instances import InstanceStack
from gper.replay.samplers.base import _TINY_WEIGHT


class InstanceKernels:
    """Runs the instances' sample, update and add, batched where the back end can.

    Args:
        stack: the stacked tensors.
        members: the instances (buffers on views of ``stack``), instance ``i`` of seed ``seed + i``.
    """

    def __init__(self, stack: InstanceStack, members: Sequence) -> None:
        self.stack, self.members = stack, list(members)
        self.kernels = members[0]._core.kernels
        self.batched = batched(self.kernels)
        self.rows = stack.rows.view(torch.int32)  # [N, capacity, W], what the kernels gather
        #: (alphas, eps) -> their [N] float32 device tensors: kept while the buffer lives, since a
        #: captured graph reads them at their address (settings change rarely, each is 8 N bytes)
        self._params: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        #: each instance's own beta scalar (what a sample of the default beta reads), and all of
        #: them as one strided [N] view: an identity check finds it without a look at addresses
        self._own_betas = [m._core.beta.scalar for m in members]
        self._own_vector = stack.tree["scalars"][:, S_BETA]
        self.update_params()  # the first, made now: never inside a caller's graph capture

    @property
    def policy(self):
        return self.members[0]._core.policy  # the mode and weight norm every instance shares

    # ---------------------------------------------------------------- sample

    def sample_into(self, parts: dict[str, torch.Tensor], betas: list[torch.Tensor]) -> None:
        """Every instance's draw into ``parts`` (``rows`` [N, B, W], ``indices``, ``generations``,
        ``weights`` [N, B]), then the sampler's weight normalisation."""
        if not self.batched:
            for i, m in enumerate(self.members):
                m._core.sample_into({k: v[i] for k, v in parts.items()}, betas[i])
            return
        out = SampleOut(parts["rows"], parts["indices"], parts["generations"], parts["weights"])
        own = all(b is o for b, o in zip(betas, self._own_betas, strict=True))
        beta = self._own_vector if own else betas
        seed = self.members[0]._core.seed  # instance i's is seed + i (restores keep it so)
        self.kernels.sample_instances(
            state=self.stack.tree_state(), rows=self.rows, seed=seed, mode=self.policy.kernel_mode, beta=beta, out=out
        )
        self.normalise(parts, betas, beta)

    def normalise(self, parts: dict[str, torch.Tensor], betas: list[torch.Tensor], beta=None) -> None:
        """``batch`` normalisation of every instance's weights, as :meth:`SamplingPolicy.normalise`
        does it for one: over [N, B] at once on CUDA, one instance at a time on the CPU. ``beta``:
        the same exponents as the kernel read them (default ``betas``)."""
        policy = self.policy
        if policy.weight_norm != "batch" or policy.unit_weights:
            return
        if self.stack.rows.device.type != "cuda" or any(b.dtype != torch.float32 for b in betas):
            for i, m in enumerate(self.members):
                m._core.policy.normalise({k: v[i] for k, v in parts.items()}, m.tree, betas[i])
            return
        w, idx = parts["weights"], parts["indices"]
        top = w.amax(dim=1, keepdim=True)
        leaf = self.stack.tree["tree"].gather(1, idx + self.stack.layout.leaf_offset)
        # in place where the betas lie evenly
        beta = beta_vector(betas if beta is None else beta, len(betas)).view(-1, 1)
        wide = reference.is_weights(leaf, leaf.amin(dim=1, keepdim=True), beta)
        w.copy_(torch.where(top >= _TINY_WEIGHT, w / top, wide))

    # ---------------------------------------------------------------- update

    @property
    def batched_update(self) -> bool:
        return self.batched and self.policy.rank is None  # rank mode writes each instance's own keys

    def update_params(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every instance's (alpha, eps) as the [N] float32 device tensors the batched update reads;
        made (once per setting) before a graph capture, never inside it. None where it loops."""
        if not self.batched_update:
            return None
        from gper.ops.tree.triton_instances import instance_params

        key = (tuple(m.alpha for m in self.members), tuple(m.eps for m in self.members))
        if key not in self._params:
            device = self.stack.rows.device
            self._params[key] = (instance_params(key[0], device), instance_params(key[1], device))
        return self._params[key]

    def set_priorities(self, idx, td, gen, params) -> None:
        """Every instance's priorities from its row of ``idx``, ``td`` (and ``gen``) [N, B]."""
        if params is None:
            for i, m in enumerate(self.members):
                m._core.set_priorities(idx[i], td[i], None if gen is None else gen[i], m.alpha, m.eps)
            return
        self.kernels.update_instances(
            state=self.stack.tree_state(), idx=idx, td=td, expected_gen=gen, alpha=params[0], eps=params[1]
        )

    # ---------------------------------------------------------------- add

    def add(self, values: tuple[torch.Tensor, ...], n: int, skip: int) -> torch.Tensor:
        """Every instance's add of its ``values[.][i]`` (on the device); [N, n'] slots written."""
        members = self.members
        if not self.batched:
            return torch.stack([m._add(tuple(v[i] for v in values), n, skip) for i, m in enumerate(members)])
        first = members[0]
        pos = self.kernels.add_rows_instances(
            state=self.stack.tree_state(),
            rows=self.rows,
            fields=first.rows.field_bytes,
            values=values,
            plan=first._add_plan,
            skip=skip,
            total=n,
            leaf_value=self.policy.new_item_value,
        )
        for i, m in enumerate(members):  # rank mode's new keys (nothing in the other modes)
            m.policy.on_add(m.tree, pos[i])
        return pos

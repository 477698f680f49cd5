"""Several instances' tree kernels, one instance at a time: the generic loop over a back end's
single-tree kernels on views ``[i]`` of stacked tensors (a buffer of ``instances=N``).

Every back end gets these; the Triton back end also has one-launch twins
(:mod:`gper.ops.tree.triton_instances`), which are checked against this loop bit for bit.
:func:`batched` says which a back end has. Instance ``i`` draws with the Philox key ``seed + i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from gper.ops.state import SampleOut, TreeState


def member_state(state: TreeState, i: int) -> TreeState:
    """Instance ``i``'s tree: views ``[i]`` of the stacked tensors."""
    return TreeState(state.layout, *(t[i] for t in state[1:]))


def batched(kernels: ModuleType) -> bool:
    """Whether ``kernels`` launches several instances at once (``sample_instances`` and the others)."""
    return all(hasattr(kernels, name) for name in ("sample_instances", "update_instances", "add_rows_instances"))


def beta_vector(beta: torch.Tensor | Sequence[torch.Tensor], n: int) -> torch.Tensor:
    """``beta`` (as :func:`gper.ops.tree.triton_instances.sample_instances` takes it) as an [n]
    tensor: a strided view where it can be (stride 0 for one shared beta), else a stacked copy."""
    t, stride = beta_pointer(beta, n)
    return t.expand(n) if t.dim() == 0 and stride == 0 else torch.as_strided(t, (n,), (stride,))


def beta_pointer(beta: torch.Tensor | Sequence[torch.Tensor], n: int) -> tuple[torch.Tensor, int]:
    """``(tensor, stride)`` the kernel reads instance k's beta at: a 0-d tensor is every instance's
    (stride 0), an [N] tensor one each; a sequence of N 0-d views one each, read in place where
    they lie at a common stride of one storage (each instance's own scalar), else stacked."""
    if isinstance(beta, torch.Tensor):
        return (beta, 0) if beta.dim() == 0 else (beta, beta.stride(0))
    views = list(beta)
    if len(views) == 1:
        return views[0], 0
    step = views[1].data_ptr() - views[0].data_ptr()
    same = all(
        v.dtype == torch.float32 and v.untyped_storage().data_ptr() == views[0].untyped_storage().data_ptr()
        for v in views
    )
    even = all(v.data_ptr() - views[0].data_ptr() == i * step for i, v in enumerate(views))
    if same and even and step >= 0 and step % 4 == 0:
        return views[0], step // 4
    return torch.stack(views), 1


def loop_sample(
    kernels: ModuleType,
    *,
    state: TreeState,
    rows: torch.Tensor,
    seed: int,
    mode: int,
    beta: torch.Tensor | Sequence[torch.Tensor],
    out: SampleOut,
) -> None:
    """``sample_instances`` one instance at a time: instance i's ``sample`` with key ``seed + i``."""
    n = out.idx.shape[0]
    for i in range(n):
        b = beta if isinstance(beta, torch.Tensor) and beta.dim() == 0 else beta[i]
        views = SampleOut(*(o[i] for o in out))
        kernels.sample(state=member_state(state, i), rows=rows[i], seed=seed + i, mode=mode, beta=b, out=views)


def loop_update(
    kernels: ModuleType,
    *,
    state: TreeState,
    idx: torch.Tensor,
    td: torch.Tensor,
    expected_gen: torch.Tensor | None,
    alpha: Sequence[float],
    eps: Sequence[float],
) -> None:
    """``update_instances`` one instance at a time (``idx``, ``td``, ``expected_gen`` [N, B])."""
    for i in range(idx.shape[0]):
        kernels.update(
            state=member_state(state, i),
            idx=idx[i].contiguous(),
            td=td[i].contiguous(),
            expected_gen=None if expected_gen is None else expected_gen[i],
            alpha=float(alpha[i]),
            eps=float(eps[i]),
        )


def loop_add_rows(
    kernels: ModuleType,
    *,
    state: TreeState,
    rows: torch.Tensor,
    fields,
    values,
    plan,
    skip: int,
    total: int,
    leaf_value: float | None,
) -> torch.Tensor:
    """``add_rows_instances`` one instance at a time (``values`` [N, n, ...] each); [N, n] slots."""
    return torch.stack(
        [
            kernels.add_rows(
                state=member_state(state, i),
                rows=rows[i],
                fields=fields,
                values=tuple(v[i] for v in values),
                plan=plan,
                skip=skip,
                total=total,
                leaf_value=leaf_value,
            )
            for i in range(rows.shape[0])
        ]
    )

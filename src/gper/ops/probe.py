"""Does the Triton back end work on this GPU? A small run of its kernels against the torch twin.

Triton compiles its kernels for the GPU at the first launch, so an unsupported architecture, a
broken driver or a broken toolchain shows up only then, in the middle of a training run. A
buffer that chose Triton by itself (``backend="auto"``) runs this probe once per device and
process when it is built: every kernel of ``add``, ``update`` (with the stale check) and
``sample`` on a 40-slot, 3-level tree, compared with the torch back end on inputs whose sums are
exact in float32 (priorities that are powers of two), so both must draw the same slots.
"""

from __future__ import annotations

import math

import torch

from gper.ops.layout import TreeLayout
from gper.ops.state import MODE_PROPORTIONAL, N_COUNTERS, N_SCALARS, S_MAXP, SampleOut, TreeState

_CAPACITY, _ARITY, _DRAWS = 40, 4, 64

#: outcome per device: None when Triton works there, else why not
_RESULTS: dict[torch.device, str | None] = {}


def _run(kernels, device: torch.device) -> dict[str, torch.Tensor]:
    lay = TreeLayout.build(_CAPACITY, _ARITY)
    tree = torch.zeros(lay.numel + 1, device=device)
    mintree = torch.full((lay.numel + 1,), math.inf, device=device)
    gen = torch.zeros(_CAPACITY, dtype=torch.int32, device=device)
    counters = torch.zeros(N_COUNTERS, dtype=torch.int64, device=device)
    scalars = torch.zeros(N_SCALARS, device=device)
    scalars[S_MAXP] = 1.0
    state = TreeState(lay, tree, mintree, gen, kernels.make_claims(layout=lay, device=device), counters, scalars)
    pos = kernels.add_positions(state=state, n=_CAPACITY, skip=0)
    kernels.add_commit(state=state, pos=pos, total=_CAPACITY, leaf_value=None)
    idx = torch.arange(_CAPACITY, device=device)
    # |td| + eps = 4^(i mod 5), so with alpha = 0.5 every priority is a power of two: exact sums
    eps = 2.0**-4
    td = torch.pow(4.0, (idx % 5).double()).float() - eps
    expected = torch.ones(_CAPACITY, dtype=torch.int32, device=device)
    kernels.update(state=state, idx=idx, td=td, expected_gen=expected, alpha=0.5, eps=eps)
    rows = torch.arange(_CAPACITY * 4, dtype=torch.int32, device=device).view(_CAPACITY, 4)
    out = SampleOut(
        rows=torch.empty(_DRAWS, 4, dtype=torch.int32, device=device),
        idx=torch.empty(_DRAWS, dtype=torch.int64, device=device),
        gen=torch.empty(_DRAWS, dtype=torch.int32, device=device),
        w=torch.empty(_DRAWS, device=device),
    )
    kernels.sample(
        state=state, rows=rows, seed=7, mode=MODE_PROPORTIONAL, beta=torch.tensor(0.5, device=device), out=out,
    )  # fmt: skip
    return out._asdict() | {"tree": tree, "mintree": mintree, "counters": counters}


def _compare(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> str | None:
    for name in ("idx", "rows", "gen", "counters", "mintree"):
        if not torch.equal(got[name], want[name]):
            return f"its {name} differ from the torch back end's"
    for name in ("w", "tree"):
        if not torch.allclose(got[name], want[name], rtol=1e-5, atol=0):
            return f"its {name} differ from the torch back end's"
    return None


def triton_problem(device: torch.device) -> str | None:
    """None when the Triton kernels compile, launch and agree with the torch back end on
    ``device``; else a one-line reason. Runs once per device and process (one host sync)."""
    device = torch.device(device)
    if device not in _RESULTS:
        _RESULTS[device] = _probe(device)
    return _RESULTS[device]


def _probe(device: torch.device) -> str | None:
    from gper.ops.tree import reference

    try:
        from gper.ops.tree import triton as tree_triton

        got = _run(tree_triton, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as err:  # noqa: BLE001 - whatever the compiler, driver or launcher raised
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"{type(err).__name__}: {first}"[:300]
    return _compare(got, _run(reference, device))


def forget() -> None:
    """Probe again at the next :func:`triton_problem` (tests, or after fixing a driver in-process)."""
    _RESULTS.clear()

"""The benchmarks' workload: the reference transition, its random data.

The reference transition (51-float obs, int64 action, float32 reward, 51-float next_obs, bool
done) is what every gper benchmark stores, with alpha 0.6, beta 0.4 and eps 1e-6. Everything is
generated on the device, in chunks, so filling 2^25 slots needs no host memory. The buffers
timed on it are in :mod:`gper.bench.peers`.
"""

from __future__ import annotations

import math

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

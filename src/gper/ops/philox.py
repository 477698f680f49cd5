"""Philox4x32-10 in plain PyTorch, bit-identical to Triton's ``tl.randint4x``.

The torch back end draws its random numbers from the same counter-based generator as the
Triton kernels, so both back ends return the same samples for the same seed and counter
(Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011). Integers are held in
int64 tensors; every value stays in [0, 2^32). The same code runs on int64 NumPy arrays, which the
CPU back end uses: on a few thousand counters NumPy's operators cost a third of torch's.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57


def _mul_hi_lo(a: int, b: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    # the 64-bit product of two 32-bit words, computed in int64 arithmetic that wraps past 2^63:
    # its two's-complement bits are the unsigned product's, so masking recovers both halves
    prod = b * a
    return (prod >> 32) & _MASK32, prod & _MASK32


def randint4x(seed: int, offset: torch.Tensor | np.ndarray, n_rounds: int = 10) -> tuple[torch.Tensor, ...]:
    """Four blocks of random uint32 (as int64) for each counter in ``offset``.

    Args:
        seed: integer key, as passed to ``tl.randint4x``.
        offset: int64 tensor (or int64 NumPy array) of counters, any shape.
        n_rounds: Philox rounds (10, as Triton's default).

    Returns:
        Four int64 tensors (arrays, for an array ``offset``) shaped like ``offset``, values in [0, 2^32).
    """
    seed &= 0xFFFFFFFFFFFFFFFF
    k0, k1 = seed & _MASK32, seed >> 32
    c0 = offset & _MASK32
    c1 = (offset >> 32) & _MASK32
    c2 = c0 * 0  # zeros of the same kind (tensor or array)
    c3 = c2
    for _ in range(n_rounds):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3

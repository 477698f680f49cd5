"""Philox4x32-10 in plain PyTorch, bit-identical to Triton's ``tl.randint4x``.

The torch back end draws its random numbers from the same counter-based generator as the
Triton kernels, so both back ends return the same samples for the same seed and counter
(Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011). Integers are held in
int64 tensors; every value stays in [0, 2^32). The same code runs on int64 NumPy arrays, and
:func:`randint4x_u32` is the same generator in fewer NumPy operations, which the CPU back end uses.
"""

from __future__ import annotations

import functools
import sys

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


#: where the low and high 32 bits of a uint64 sit in its two uint32 words
_LO, _HI = (0, 1) if sys.byteorder == "little" else (1, 0)
_ROUND_MULTIPLIERS = np.array([[_ROUND_A], [_ROUND_B]], dtype=np.uint64)


@functools.lru_cache(maxsize=64)
def _round_keys(seed: int, n_rounds: int) -> np.ndarray:
    """[n_rounds, 2, 1] uint64: the key words (k0, k1) that round r mixes in."""
    seed &= 0xFFFFFFFFFFFFFFFF
    k0, k1 = seed & _MASK32, seed >> 32
    out = []
    for _ in range(n_rounds):
        out.append((k0, k1))
        k0, k1 = (k0 + _KEY_A) & _MASK32, (k1 + _KEY_B) & _MASK32
    keys = np.array(out, dtype=np.uint64).reshape(n_rounds, 2, 1)
    keys.flags.writeable = False  # shared between calls
    return keys


def randint4x_u32(seed: int, offset: np.ndarray, n_rounds: int = 10) -> tuple[np.ndarray, ...]:
    """:func:`randint4x` on a NumPy array of counters, as uint32 arrays, in three operations a round.

    The words that are multiplied (c0, c2) are kept together in one [2, n] uint64 array, so one
    multiply gives both 64-bit products, whose high and low halves are uint32 views of it (no
    shift, no mask); the other two words (c1, c3) are the low halves of the previous round's
    products, so the products go to two buffers in turn.

    Args:
        seed: integer key.
        offset: int64 (or uint64) counters, any shape.

    Returns:
        Four uint32 arrays shaped like ``offset``: the same words as :func:`randint4x`.
    """
    shape = np.shape(offset)
    ctr = np.ascontiguousarray(offset).astype(np.uint64, copy=False).reshape(-1)
    n = ctr.size
    even = np.zeros((2, n), dtype=np.uint64)  # c0, c2
    even[0] = ctr & _MASK32
    odd = np.zeros((2, n), dtype=np.uint32)  # c1, c3
    odd[0] = ctr >> 32
    prods = (np.empty((2, n), dtype=np.uint64), np.empty((2, n), dtype=np.uint64))
    # reversed rows: c0' and c1' come from c2's product, c2' and c3' from c0's
    halves = [p.view(np.uint32).reshape(2, n, 2)[::-1] for p in prods]
    for r, key in enumerate(_round_keys(seed, n_rounds)):
        np.multiply(even, _ROUND_MULTIPLIERS, out=prods[r % 2])  # [c0 * A, c2 * B], exact in 64 bits
        # c0' = hi(c2 B) ^ c1 ^ k0, c2' = hi(c0 A) ^ c3 ^ k1; c1' = lo(c2 B), c3' = lo(c0 A)
        np.bitwise_xor(halves[r % 2][:, :, _HI], odd, out=even)
        even ^= key
        odd = halves[r % 2][:, :, _LO]
    out = (even[0], odd[0], even[1], odd[1])
    return tuple(x.astype(np.uint32).reshape(shape) for x in out)

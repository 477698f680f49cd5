"""Philox4x32-10 in torch (:mod:`gper.ops.philox`) against Triton's ``tl.randint4x``, bit for bit.

Both back ends draw the same samples only if these agree for every seed and every 64-bit counter.
The test kernel stores the uint32 words through int64, as the reference returns them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gper.ops import philox
from helpers import TRITON_ON_CPU

SEEDS = [0, 1, 12345, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 5, 2**62 + 12345, 2**63 - 1]
EDGE_OFFSETS = [0, 1, 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7, 2**62 + 3, 2**63 - 1]


def offsets() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(0, 2**63 - 1, (40,), generator=g, dtype=torch.int64)
    return torch.cat([torch.tensor(EDGE_OFFSETS, dtype=torch.int64), torch.arange(24), rand])


def test_known_answer():
    """Random123's known-answer vector for Philox4x32-10 with counter 0 and key 0."""
    words = philox.randint4x(0, torch.zeros(1, dtype=torch.int64))
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_words_are_uint32_and_depend_on_seed_and_counter():
    off = offsets()
    a = torch.stack(philox.randint4x(7, off))
    assert a.dtype == torch.int64 and int(a.min()) >= 0 and int(a.max()) < 2**32
    assert int(a.max()) >= 2**31, "the top bit is never set: words look like int32, not uint32"
    b = torch.stack(philox.randint4x(8, off))
    assert not torch.equal(a, b)
    # counters that differ only in their high 32 bits give different words
    hi = torch.stack(philox.randint4x(7, off + 2**32))
    assert (hi != a).all(0).float().mean() > 0.99
    assert torch.equal(a, torch.stack(philox.randint4x(7, off.clone())))


@pytest.mark.parametrize("seed", SEEDS)
def test_numpy_arrays_give_the_same_words(seed):
    """The CPU back end runs the same code on NumPy arrays: identical words, every counter."""
    off = offsets()
    from_numpy = [torch.from_numpy(w) for w in philox.randint4x(seed, off.numpy())]
    assert all(torch.equal(a, b) for a, b in zip(philox.randint4x(seed, off), from_numpy, strict=True))


@pytest.mark.parametrize("seed", SEEDS + [-1, 2**64 - 1])
def test_the_three_op_numpy_version_gives_the_same_words(seed):
    """randint4x_u32 (the CPU back end's) against randint4x, every counter, any shape."""
    off = offsets()
    want = philox.randint4x(seed, off)
    got = philox.randint4x_u32(seed, off.numpy())
    assert all(g.dtype == np.uint32 for g in got)
    assert all(torch.equal(w, torch.from_numpy(g.astype(np.int64))) for w, g in zip(want, got, strict=True))
    grid = off[:60].reshape(3, 4, 5)
    got = philox.randint4x_u32(seed, grid.numpy())
    assert all(g.shape == (3, 4, 5) for g in got)
    assert all(
        torch.equal(w, torch.from_numpy(g.astype(np.int64)))
        for w, g in zip(philox.randint4x(seed, grid), got, strict=True)
    )


if TRITON_ON_CPU:
    import triton
    import triton.language as tl

    @triton.jit
    def _randint4x_kernel(seed, offsets, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        off = tl.load(offsets + i, mask=m, other=0)
        r0, r1, r2, r3 = tl.randint4x(seed, off)
        tl.store(out + i, r0.to(tl.int64), mask=m)
        tl.store(out + n + i, r1.to(tl.int64), mask=m)
        tl.store(out + 2 * n + i, r2.to(tl.int64), mask=m)
        tl.store(out + 3 * n + i, r3.to(tl.int64), mask=m)


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")
@pytest.mark.parametrize("seed", SEEDS)
def test_reference_matches_tl_randint4x(seed):
    off = offsets()
    out = torch.full((4, off.numel()), -1, dtype=torch.int64)
    _randint4x_kernel[(triton.cdiv(off.numel(), 32),)](seed, off, out, off.numel(), BLOCK=32)
    want = torch.stack(philox.randint4x(seed, off))
    bad = (out != want).nonzero()
    if bad.numel():
        word, col = bad[0].tolist()
        raise AssertionError(
            f"seed {seed}: {bad.shape[0]} words differ; first: word {word} of offset {off[col].item()}: "
            f"triton {out[word, col].item():#x}, torch {want[word, col].item():#x}"
        )

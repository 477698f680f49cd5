"""A population's hidden layer (:mod:`gper.dqn.population_layers`) against ``baddbmm`` + ``relu``:
forward, gradients of input, weight and bias, NaN, and the one-pass kernel under the interpreter."""

from __future__ import annotations

import math

import pytest
import torch

from gper.dqn.population_layers import bias_relu_, linear_relu
from helpers import TRITON_ON_CPU


def _reference(x, w, b):
    return torch.relu(torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2)))


@pytest.mark.parametrize("shape", [(3, 5, 7, 4), (1, 16, 8, 32)])
def test_forward_and_gradients_are_baddbmm_relus(shape):
    n, batch, inp, out = shape
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((n, batch, inp), (n, out, inp), (n, out)))
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = [t.clone().requires_grad_() for t in (x, w, b)]
    y, want = linear_relu(*leaves), _reference(*ref)
    torch.testing.assert_close(y, want)
    up = torch.randn(want.shape, generator=g, dtype=torch.float64)
    (y * up).sum().backward()
    (want * up).sum().backward()
    for a, c in zip(leaves, ref, strict=True):
        torch.testing.assert_close(a.grad, c.grad)
    assert torch.autograd.gradcheck(linear_relu, tuple(t.clone().requires_grad_() for t in (x, w, b)))


def test_no_grad_and_nan():
    x = torch.randn(2, 3, 4)
    w, b = torch.randn(2, 5, 4), torch.zeros(2, 5)
    x[1, 2, 0] = math.nan
    with torch.no_grad():
        y = linear_relu(x, w, b)
    assert torch.isnan(y[1, 2]).all() and not torch.isnan(y[:, :2]).any() and (y[0] >= 0).all()


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs the Triton interpreter (TRITON_INTERPRET=1)")
def test_the_one_pass_kernel_is_the_torch_ops():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(3, 6, 40, generator=g)
    y[2, 1, 3] = math.nan
    b = torch.randn(3, 40, generator=g)
    got, want = bias_relu_(y.clone(), b, backend="triton"), bias_relu_(y.clone(), b, backend="torch")
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # the same one addition, bit for bit
    with pytest.raises(ValueError, match="contiguous"):
        bias_relu_(y.transpose(0, 1), b, backend="triton")
    with pytest.raises(ValueError, match="backend auto, triton or torch"):
        bias_relu_(y, b, backend="numpy")

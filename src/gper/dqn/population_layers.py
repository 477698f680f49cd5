"""A hidden layer of N agents on CUDA: ``relu(x @ W^T + b)`` as one batched GEMM and one pass.

Why: ``torch.baddbmm(bias.unsqueeze(1), x, W^T)`` makes cuBLAS read a full ``[N, B, out]`` input,
so PyTorch first expands the bias into one (a strided copy, not vectorized), then the GEMM reads
it back, then ``relu_`` reads and writes the output again; and autograd's gradient of ``W^T`` is
transposed into the weight's layout by another copy. At 256 agents of the cartpole network those
copies were the iteration's costliest kernel (406 µs of its 2,355:
``benchmarks/results/train-step-population-nvidia-h200-20261204-184341.md``). Here the forward is
``torch.bmm`` and one elementwise pass adding the bias and applying the ReLU; the backward masks
the output's gradient once and forms the weight's gradient in its own layout
(``gz^T @ x``, which cuBLAS reads transposed without a copy), the bias's as a sum over the batch.

NaN propagates as ``torch.relu`` propagates it (a NaN pre-activation stays NaN); the gradient
flows where the output is > 0, as ``threshold_backward`` lets it.
"""

from __future__ import annotations

import torch

from gper._triton import HAS_TRITON, tl, triton

#: elements a program of the bias-and-ReLU pass handles
BLOCK = 1024


if HAS_TRITON:

    @triton.jit
    def _bias_relu_kernel(y_ptr, b_ptr, n, out, per_agent, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        bias = tl.load(b_ptr + (offs // per_agent) * out + offs % out, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask) + bias
        tl.store(y_ptr + offs, tl.where(y < 0.0, 0.0, y), mask=mask)  # NaN stays NaN, as torch.relu


def bias_relu_(y: torch.Tensor, bias: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``y [N, B, out] = relu(y + bias[:, None, :])`` in place: ``backend`` "triton" (one pass; the
    default on CUDA), "torch" (two ops; the default elsewhere) or "auto"."""
    if backend == "auto":
        backend = "triton" if y.is_cuda and HAS_TRITON else "torch"
    if backend == "torch":
        return torch.relu_(y.add_(bias.unsqueeze(1)))
    n, b, out = y.shape
    if backend != "triton" or not (y.is_contiguous() and bias.is_contiguous() and bias.shape == (n, out)):
        raise ValueError(
            f"bias_relu_ takes backend auto, triton or torch and, for triton, contiguous y [N, B, out] and "
            f"bias [N, out]; got {backend!r}, y {tuple(y.shape)}, bias {tuple(bias.shape)}"
        )
    _bias_relu_kernel[(triton.cdiv(y.numel(), BLOCK),)](y, bias, y.numel(), out, b * out, BLOCK=BLOCK)
    return y


class _LinearReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, backend: str) -> torch.Tensor:
        y = bias_relu_(torch.bmm(x, weight.transpose(1, 2)), bias, backend)
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        x, weight, y = ctx.saved_tensors
        gz = torch.where(y > 0, grad_y, 0.0)
        gx = torch.bmm(gz, weight) if ctx.needs_input_grad[0] else None
        gw = torch.bmm(gz.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        gb = gz.sum(1) if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None


def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """``relu(x @ weight^T + bias)`` for N agents at once: ``x [N, B, in]``, ``weight [N, out, in]``,
    ``bias [N, out]`` -> ``[N, B, out]``, differentiable in all three; ``backend`` of the
    bias-and-ReLU pass (:func:`bias_relu_`)."""
    return _LinearReLU.apply(x, weight, bias, backend)

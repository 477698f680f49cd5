"""The matmul precision of a run (``precision`` of the settings) as PyTorch's cuBLAS and cuDNN switches.

PyTorch runs float32 matmuls in full FP32 unless ``torch.backends.cuda.matmul.allow_tf32`` is
set; a run's ``precision="tf32"`` (the default) means TF32 tensor cores for every float32 matmul
of the step (the batched matmuls of a population, the backward of the fused forward), so the
switch is set for the run and put back after it. Convolutions (the pixel network) have a switch
of their own, ``torch.backends.cudnn.allow_tf32``, which PyTorch turns *on* by default: it follows
the same setting, so ``"fp32"`` means full FP32 convolutions too. CUDA graphs keep the kernels
chosen when they were captured, which happens inside the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def matmul_precision(precision: str | None) -> Iterator[None]:
    """float32 matmuls on TF32 tensor cores while the block runs if ``precision`` is ``"tf32"``, in
    full FP32 for ``"fp32"`` and ``"bf16"`` (whose autocast leaves float32 matmuls in float32);
    None leaves the switch as it is. cuDNN's convolutions follow the same setting. The switches'
    values before are restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if precision is not None:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

"""The stack's exponents written by one copy: :func:`even_view` and :func:`write_all_scalars` of
:mod:`gper.replay.instance_calls` (on CUDA graphed samples of an [N] beta take this path; the GPU
tests of the instances check it bit for bit against single buffers)."""

from __future__ import annotations

import math

import torch

from gper.replay.exponent import ExponentInput
from gper.replay.instance_calls import even_view, write_all_scalars


def test_even_view_of_a_stack_column():
    t = torch.zeros(4, 5)
    view = even_view([t[i, 2] for i in range(4)])
    assert view is not None and view.shape == (4,)
    view.copy_(torch.arange(4.0))
    assert torch.equal(t[:, 2], torch.arange(4.0)) and t[:, [0, 1, 3, 4]].abs().sum() == 0
    assert even_view([t[0, 2], t[2, 2], t[1, 2]]) is None  # not evenly spaced
    assert even_view([t[0, 2], torch.zeros(4, 5)[1, 2]]) is None  # two storages
    assert even_view([t[0, 2]]) is None  # one alone: nothing to gain
    assert even_view([t[1, 2], t[0, 2]]) is None  # backwards


def test_write_all_clamps_and_reads_nan_as_one():
    t = torch.zeros(3, 4)
    inputs = [ExponentInput(t[i, 1]) for i in range(3)]
    inputs[0].tensor(0.25, graphed=False)  # a float written, remembered
    out = write_all_scalars(inputs, torch.tensor([2.0, math.nan, 0.5]))
    assert out is not None and all(o is x.scalar for o, x in zip(out, inputs, strict=True))
    assert t[:, 1].tolist() == [1.0, 1.0, 0.5]
    inputs[0].tensor(0.25, graphed=False)  # forgotten: the same float is written again
    assert t[0, 1] == 0.25
    write_all_scalars(inputs, torch.tensor(-3.0))  # a 0-d value for every instance
    assert t[:, 1].tolist() == [0.0, 0.0, 0.0]
    assert write_all_scalars([ExponentInput(torch.zeros(())) for _ in range(2)], torch.tensor(0.5)) is None

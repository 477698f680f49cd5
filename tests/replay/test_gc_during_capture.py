"""The buffer's own captures (sample slots, address-keyed add and update graphs) run with the
cyclic collector paused: a collection during a capture could destroy a garbage CUDA graph there,
which invalidates the capture (see ``gper.replay.graphs.capture``)."""

from __future__ import annotations

import gc

import pytest
import torch

import gper
from helpers import SPEC, transitions

pytestmark = pytest.mark.gpu


def test_no_collection_runs_while_the_buffer_captures():
    seen = []

    def hook(phase, info):
        if phase == "start":
            seen.append(torch.cuda.is_current_stream_capturing())

    thresholds = gc.get_threshold()
    gc.callbacks.append(hook)
    gc.set_threshold(1, 1, 1)  # a collection at (nearly) every allocation
    try:
        for sampling in ("proportional", "rank"):
            rb = gper.PrioritizedReplayBuffer(4096, SPEC, device="cuda", sampling=sampling, seed=1)
            data = {k: v.cuda() for k, v in transitions(256).items()}
            td = torch.randn(256, device="cuda")
            for _ in range(4):  # first sight, then the captures, then replays
                rb.add(data)
                batch = rb.sample(256)
                rb.update_priorities(batch, td)
                rb.update_priorities(batch.indices, td)
                del batch
            torch.cuda.synchronize()
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(hook)
    assert seen, "the collector never ran: the test does not test anything"
    assert not any(seen), f"{sum(seen)} of {len(seen)} collections ran during a capture"
    assert gc.isenabled()

"""A step's capture survives garbage: a CUDA graph left in a dead reference cycle (an agent whose
step holds its own bound methods) that the collector destroys mid-capture used to invalidate the
capture (``CUBLAS_STATUS_EXECUTION_FAILED``, then ``cudaErrorStreamCaptureInvalidated``), now and
then, depending on allocation counts. Here the collector is made to run at every allocation, and
inside the captured phase a captured graph is left in a fresh (young, so next to be collected)
reference cycle, every round. With plain ``torch.cuda.graph`` this fails every time."""

from __future__ import annotations

import gc

import pytest
import torch

from gper.training.phases import PhasedStep

pytestmark = pytest.mark.gpu


def _captured_graph(lin: torch.nn.Module, x: torch.Tensor) -> torch.cuda.CUDAGraph:
    """A captured graph of one matmul."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lin(x)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        lin(x)
    return graph


@pytest.mark.parametrize("concurrent", [False, True], ids=["serial", "side-stream"])
def test_phased_step_capture_survives_graphs_collected_mid_capture(concurrent):
    lin = torch.nn.Linear(256, 256, device="cuda")
    x = torch.randn(512, 256, device="cuda")
    out = torch.zeros(512, 256, device="cuda")
    pending: list = []

    def matmuls():
        y = lin(x)
        if pending:
            # the graph's last reference is now a young dead cycle: the collector's next gen-0
            # pass (at the allocations below, with threshold 1) would destroy the graph
            cycle: list = [pending.pop()]
            cycle.append(cycle)
            del cycle
        _ = [[] for _ in range(64)]
        out.copy_(lin(torch.relu(y)))

    def scale():
        out.mul_(0.5)

    thresholds = gc.get_threshold()
    try:
        for _ in range(10):
            step = PhasedStep(
                {"matmuls": matmuls, "scale": scale},
                torch.device("cuda"),
                warmup=1,
                concurrent=("scale",) if concurrent else (),
            )
            gc.set_threshold(1, 1, 1)
            for _ in range(3):  # warm-up, then the captures (by phase, then whole), then a replay
                # one cycle for each capture of the phase (by phase, then whole)
                pending.extend([_captured_graph(lin, x), _captured_graph(lin, x)])
                step.run()
                pending.clear()
            gc.set_threshold(*thresholds)
            assert step.captured
            torch.cuda.synchronize()
            expected = lin(torch.relu(lin(x))) * 0.5
            torch.testing.assert_close(out, expected)
    finally:
        gc.set_threshold(*thresholds)
    assert gc.isenabled()

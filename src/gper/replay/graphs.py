"""CUDA graphs that the buffer captures for itself, so an eager call costs one replay.

Launching a Triton kernel from Python costs several times the host time of replaying a captured
graph (``docs/performance.md`` has the figures, under "Eager calls"). So the buffer captures each call
shape once and replays it:

* :class:`GraphCache` holds captured calls. ``run`` copies the caller's inputs into static
  tensors and replays; ``run_by_address`` replays a graph captured directly on the caller's
  tensors, which is valid exactly when this call's tensors sit at the same addresses (the graph
  then reads them where they are: no copies). Buffers reach that case in steady training loops,
  where PyTorch's caching allocator hands out the same blocks step after step.
* :class:`SampleSlot` is a captured ``sample`` whose outputs (and their field views) are reused
  only while nothing outside the slot refers to them: a slot whose batch, field tensors or views
  of them are still alive anywhere (Python references, autograd saved tensors) is busy, and the
  buffer samples into another slot or launches directly.
* :func:`capture` is ``torch.cuda.graph`` with Python's cyclic garbage collector held off: every
  capture in gper goes through it (see its docstring for why).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

from gper.replay.checks import warn_no_graph_memory


@dataclass
class CapturedCall:
    """A captured graph, the static tensors it reads (``inputs``) and what it returned (``output``)."""

    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    output: object


@contextlib.contextmanager
def capture(graph: torch.cuda.CUDAGraph, pool: object | None = None, stream: torch.cuda.Stream | None = None):
    """``torch.cuda.graph(graph, pool, stream)`` with the cyclic garbage collector paused.

    A CUDA graph that has become garbage inside a reference cycle (an agent whose step holds
    bound methods of itself, say) is destroyed whenever the collector next runs. If that happens
    while another graph is being captured, the destroyed graph's ``cudaGraphExecDestroy`` is an
    operation the driver forbids during a capture: it invalidates the capture, and the next
    launch in it fails (cuBLAS reports ``CUBLAS_STATUS_EXECUTION_FAILED``, then
    ``cudaErrorStreamCaptureInvalidated``). When that happens depends on allocation counts, so
    the failure came and went between runs of the same tests. With collection paused, garbage
    waits until the capture has ended; the collector's state is restored afterwards.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            yield graph
    finally:
        if enabled:
            gc.enable()


def _capture(body: Callable[..., object], args: tuple[torch.Tensor, ...]) -> tuple[torch.cuda.CUDAGraph, object] | None:
    """``(graph, output)`` of ``body(*args)`` captured, or None (after a warning) when the capture
    runs out of device memory: the call it was made for has already run eagerly, so later calls
    of that shape simply run without a graph until memory allows one."""
    graph = torch.cuda.CUDAGraph()
    try:
        with capture(graph):
            output = body(*args)
    except torch.OutOfMemoryError:
        warn_no_graph_memory()
        return None
    return graph, output


class GraphCache:
    """Captured calls keyed by call shape (or by input addresses); least recently used evicted first."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, CapturedCall] = OrderedDict()
        self._seen: OrderedDict[Hashable, None] = OrderedDict()

    def _store(self, key: Hashable, entry: CapturedCall) -> None:
        self._entries[key] = entry
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def run(self, key: Hashable, args: tuple[torch.Tensor, ...], body: Callable[..., object]) -> tuple[object, bool]:
        """Run ``body(*args)`` through the graph captured for ``key``, copying ``args`` into its inputs.

        On the first call for ``key`` the body runs eagerly on static copies of ``args`` (that run
        is this call's result, and compiles any kernel), then is captured without running again.

        Returns:
            (result, replayed): ``replayed`` is True when ``result`` is the graph's static output,
            which the next replay overwrites.
        """
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            for dst, src in zip(entry.inputs, args, strict=True):
                dst.copy_(src, non_blocking=True)
            entry.graph.replay()
            return entry.output, True
        device = torch.device("cuda", torch.cuda.current_device())
        inputs = tuple(a.to(device, copy=True) for a in args)
        result = body(*inputs)
        captured = _capture(body, inputs)
        if captured is not None:
            self._store(key, CapturedCall(captured[0], inputs, captured[1]))
        return result, False

    def run_by_address(
        self, key: Hashable, args: tuple[torch.Tensor, ...], body: Callable[..., object]
    ) -> tuple[object, bool]:
        """Like :meth:`run`, but without copies when ``args`` sit where a captured call's inputs did.

        The graph of an address-keyed entry reads the caller's own memory, so it is replayed only
        for tensors at those exact addresses, shapes, strides and dtypes. An address set is
        captured the second time it is seen (so fresh allocations every call cost no captures);
        until then the call goes through :meth:`run`.
        """
        where = (key,) + tuple((a.data_ptr(), a.dtype, a.shape, a.stride()) for a in args)
        entry = self._entries.get(where)
        if entry is not None:
            self._entries.move_to_end(where)
            entry.graph.replay()
            return entry.output, True
        if where in self._seen:
            del self._seen[where]
            result = body(*args)
            captured = _capture(body, args)
            # hold no reference to the caller's tensors: the address match at replay is what makes
            # the graph valid, and a reference would keep a sample slot's outputs busy forever
            if captured is not None:
                self._store(where, CapturedCall(captured[0], (), captured[1]))
            return result, False
        self._seen[where] = None
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return self.run(key, args, body)

    def clear(self) -> None:
        self._entries.clear()
        self._seen.clear()


@dataclass
class SampleSlot:
    """A captured ``sample`` of one batch size with its static outputs and their prebuilt views."""

    graph: torch.cuda.CUDAGraph
    flat: torch.Tensor
    tensors: dict
    _base_refs: list[int] = field(default_factory=list)
    _base_use: int = 0

    def __post_init__(self) -> None:
        self._base_refs = _refcounts(self.tensors)
        self._base_use = _storage_uses(self.flat)

    def free(self) -> bool:
        """True when nothing outside this slot refers to its outputs (so a replay may overwrite them)."""
        return _storage_uses(self.flat) == self._base_use and _refcounts(self.tensors) == self._base_refs


class SampleSlots:
    """Captured ``sample`` calls, up to ``per_key`` slots per key (the batch size).

    A batch may still be alive while the next is drawn (the trainer keeps the last one for its
    priority update), so each batch size gets a few slots: a call replays the first free one, or
    runs eagerly (capturing a new slot while there are fewer than ``per_key``)."""

    def __init__(self, per_key: int = 3) -> None:
        self.per_key = per_key
        self._slots: dict[Hashable, list[SampleSlot]] = {}

    def run(
        self,
        key: Hashable,
        body: Callable[[], torch.Tensor],
        outputs: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    ) -> tuple[dict[str, torch.Tensor] | torch.Tensor, bool]:
        """``(body(), False)`` run eagerly, or ``(a free slot's prebuilt outputs, True)`` after its replay.

        ``body`` returns one flat tensor (every output is a view of it, so :meth:`SampleSlot.free`
        can count all of them through one storage's use count); ``outputs`` splits it into named views.
        """
        slots = self._slots.setdefault(key, [])
        for slot in slots:
            if slot.free():
                slot.graph.replay()
                return slot.tensors, True
        flat = body()  # this call's result; it also compiles the kernel before the capture
        if len(slots) < self.per_key:
            captured = _capture(body, ())
            if captured is not None:
                slots.append(SampleSlot(captured[0], captured[1], outputs(captured[1])))
        return flat, False

    def clear(self) -> None:
        self._slots.clear()


class BufferGraphs:
    """A buffer's own graphs: calls keyed by shape or by address (add, update) and sample slots.

    Off on the CPU, with ``cuda_graphs=False``, and while the caller is capturing a graph of its
    own (the buffer's kernels then land in the caller's graph)."""

    def __init__(self, enabled: bool, sample_slots: int = 3) -> None:
        self.enabled = enabled
        self.calls = GraphCache()
        self.samples = SampleSlots(sample_slots)

    @property
    def active(self) -> bool:
        return self.enabled and not capturing()

    def call(
        self, key: Hashable, args: tuple[torch.Tensor, ...], body: Callable[..., object], by_address: bool
    ) -> tuple[object, bool]:
        """``(body(*args), False)`` directly, or through a graph: see :meth:`GraphCache.run_by_address`."""
        if not self.active:
            return body(*args), False
        return (self.calls.run_by_address if by_address else self.calls.run)(key, args, body)

    def clear(self) -> None:
        self.calls.clear()
        self.samples.clear()


def _refcounts(tensors: dict[str, torch.Tensor]) -> list[int]:
    # one code path for the baseline and the check, so both count the same temporaries
    return [sys.getrefcount(t) for t in tensors.values()]


def _storage_uses(t: torch.Tensor) -> int:
    # tensors (views included) sharing t's memory; a new view of an output raises this count
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def capturing() -> bool:
    """True while the current CUDA stream is being captured (by the caller's own graph)."""
    return torch.cuda.is_current_stream_capturing()

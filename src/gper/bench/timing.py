"""Timing helpers shared by gper's benchmarks: eager calls, CUDA-graph replays, JAX calls, training steps.

How we time (as ``triton.testing.do_bench`` does, and as the notes on timing GPU work advise):
warm up first so compilation and allocation stay out of the numbers; on CUDA, record events on the
current stream around ``iters`` back-to-back calls (no synchronisation inside the loop), divide
by ``iters``, repeat, and report the median of the repeats. On the CPU, ``time.perf_counter``
takes the events' place. The caches stay warm between calls: what a buffer that fits in L2
costs is what it costs in a training loop that samples from it every step.

The family: :func:`time_fn` (eager calls; CUDA events or the host clock), :func:`time_graph`
(replays of one captured graph), :func:`time_sync` (wall time closed by a caller's sync, for
work that CUDA events cannot see, as JAX's) and :func:`time_steps` (device and wall time of
whole training steps).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gper.replay.graphs import capture

#: a repeat lasts about this long when ``iters`` is left to the calibration
DEFAULT_TARGET_MS = 20.0
_MIN_ITERS = 3
_MAX_ITERS = 10_000


@dataclass(frozen=True)
class Timing:
    """Time of one call, in microseconds.

    Attributes:
        median_us: median over the repeats of (time of ``iters`` calls) / ``iters``.
        min_us, max_us: the fastest and slowest repeat; their spread is the noise to beat.
        iters: calls per repeat.
        repeats: how many repeats.
        samples_us: every repeat's time per call.
    """

    median_us: float
    min_us: float
    max_us: float
    iters: int
    repeats: int
    samples_us: tuple[float, ...]


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for all work queued on ``device`` (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _calibrate(fn: Callable[[], object], device: torch.device, target_ms: float) -> int:
    # double the number of calls until one round costs a tenth of the target, then extrapolate
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        synchronize(device)
        dt = time.perf_counter() - t0
        if dt * 1e3 >= target_ms / 10 or n >= _MAX_ITERS:
            break
        n *= 2
    per_call_ms = max(dt * 1e3 / n, 1e-6)
    return int(min(max(target_ms / per_call_ms, _MIN_ITERS), _MAX_ITERS))


def time_fn(
    fn: Callable[[], object],
    warmup: int = 5,
    iters: int | None = None,
    repeats: int = 5,
    device: torch.device | str | None = None,
    target_ms: float = DEFAULT_TARGET_MS,
) -> Timing:
    """Time ``fn()`` called eagerly: median over ``repeats`` of the mean over ``iters`` calls.

    Args:
        fn: the work, called with no arguments; what it returns is dropped.
        warmup: calls before timing (compilation, allocator, caches).
        iters: calls per repeat; None picks enough for a repeat to last about ``target_ms``.
        repeats: timed repeats (>= 1).
        device: where ``fn`` runs: CUDA events on a CUDA device, ``perf_counter`` on the CPU;
            default the current CUDA device if there is one.
        target_ms: length of a repeat when ``iters`` is None.

    Returns:
        A :class:`Timing` in microseconds per call.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = torch.device(device) if device is not None else default_device()
    for _ in range(warmup):
        fn()
    synchronize(device)
    if iters is None:
        iters = _calibrate(fn, device, target_ms)
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) * 1e6 / iters)
    return Timing(statistics.median(samples), min(samples), max(samples), iters, repeats, tuple(samples))


def capture_graph(fn: Callable[[], object], warmup: int = 3, pool: object | None = None) -> torch.cuda.CUDAGraph:
    """Capture ``fn()`` into a CUDA graph, PyTorch's way: warm up on a side stream, then capture.

    Tensors that ``fn`` allocates during capture live in the graph's private memory pool and
    are rewritten by every replay; they are freed with the graph.

    Args:
        fn: the work to capture; it must not synchronise with the host.
        warmup: eager calls on the side stream first (lazy init, Triton compilation, cuBLAS
            workspaces: none of these may happen during capture).
        pool: a memory pool to share with other graphs (``torch.cuda.graph_pool_handle()``).

    Returns:
        The captured graph; ``graph.replay()`` runs the work again.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    try:
        with capture(graph, pool=pool):
            fn()
    except BaseException:
        # a failed capture can leave the capture stream current: later work would run there
        torch.cuda.set_stream(stream)
        raise
    torch.cuda.synchronize()
    return graph


def time_graph(
    fn: Callable[[], object],
    warmup: int = 5,
    iters: int | None = None,
    repeats: int = 5,
    capture_warmup: int = 3,
    target_ms: float = DEFAULT_TARGET_MS,
) -> Timing:
    """Capture ``fn()`` once as a CUDA graph and time its replays like :func:`time_fn`.

    Args:
        fn: the work to capture (see :func:`capture_graph`).
        warmup, iters, repeats, target_ms: as in :func:`time_fn`, counted in replays.
        capture_warmup: eager calls on a side stream before the capture.

    Returns:
        A :class:`Timing` in microseconds per replay. The graph is freed before returning.

    Raises:
        RuntimeError: CUDA is not available, or ``fn`` cannot be captured (it synchronises, or
            calls something that graphs do not support).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("time_graph needs a CUDA device")
    graph = capture_graph(fn, warmup=capture_warmup)
    try:
        return time_fn(
            graph.replay, warmup=warmup, iters=iters, repeats=repeats, device=default_device(), target_ms=target_ms
        )
    finally:
        graph.reset()


def time_sync(
    fn: Callable[[], object], sync: Callable[[object], None], warmup: int, iters: int, repeats: int
) -> Timing:
    """Median over ``repeats`` of the wall time of ``iters`` calls, closed by ``sync(last result)``.

    For JAX, whose calls return before the device is done: CUDA events on torch's stream would
    not see XLA's work, and a ``block_until_ready`` on the last result of a chain of calls that
    each consume the previous state waits for all of them.
    """
    out = None
    for _ in range(warmup):
        out = fn()
    sync(out)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            out = fn()
        sync(out)
        samples.append((time.perf_counter() - t0) * 1e6 / iters)
    return Timing(statistics.median(samples), min(samples), max(samples), iters, repeats, tuple(samples))


def time_steps(run: Callable[[], object], steps: int, repeats: int, device: torch.device) -> tuple[float, float]:
    """(median device ms per step, median wall ms per step) over ``repeats`` of ``steps`` calls of ``run``.

    Each repeat starts from an idle device. The device time comes from CUDA events around the
    calls (the host clock on the CPU); the wall time from the host clock around the same calls
    and the wait for the last one.
    """
    gpu, wall = [], []
    for _ in range(repeats):
        synchronize(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(steps):
            run()
        if device.type == "cuda":
            end.record()
            end.synchronize()
            gpu.append(start.elapsed_time(end) / steps)
        else:
            gpu.append((time.perf_counter() - t0) * 1e3 / steps)
        wall.append((time.perf_counter() - t0) * 1e3 / steps)
    return statistics.median(gpu), statistics.median(wall)

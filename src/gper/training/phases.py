"""A step made of named phases, run eagerly, as one CUDA graph, or as one CUDA graph per phase.

A training step (for example sample -> upload -> fwd_bwd -> per_update -> adam) is captured twice
after a few eager warm-up steps: once whole, the graph replayed on ordinary steps, and once phase
by phase, replayed with CUDA events between the phases on the steps that are timed. Both captures
read and write the same parameters, optimizer state and replay buffer, so either can run any
step. Each phase is a function of no arguments that leaves its outputs where the next phase
finds them (attributes of a shared state object, such as a dataclass); the tensors a
phase-by-phase capture made are kept alive here, because the later graphs were captured reading
them.

Phases named in ``concurrent`` run, in the one-graph step, on a side stream forked where they
appear and joined at the end of the step, so the phases after them run alongside (a priority
update while Adam steps: neither reads what the other writes). Eagerly and phase by phase they
run in order, so the timed steps measure each phase alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable

import torch

from gper.replay.graphs import capture
from gper.training.timing import PhaseTimer


class PhasedStep:
    """Run ``phases`` in order as one step; on CUDA, replay them from CUDA graphs after ``warmup`` steps.

    Args:
        phases: name -> function, in the order they run.
        device: where the work runs; graphs only on CUDA.
        use_graphs: capture CUDA graphs (ignored on the CPU).
        warmup: eager steps before capture, on a side stream as PyTorch's capture guide asks
            (lazy initialisation of cuBLAS workspaces and optimizer state happens there).
        state: the object whose attributes the phases share (a dataclass or a namespace); what
            its attributes hold when the phases are captured is kept alive.
        concurrent: phases that the one-graph step runs on a side stream, alongside the phases
            after them; they must not touch what those read or write.
    """

    def __init__(
        self,
        phases: dict[str, Callable[[], None]],
        device: torch.device,
        use_graphs: bool = True,
        warmup: int = 3,
        state: object | None = None,
        concurrent: tuple[str, ...] = (),
    ) -> None:
        if not phases:
            raise ValueError("a step needs at least one phase")
        unknown = [name for name in concurrent if name not in phases]
        if unknown:
            raise ValueError(f"concurrent phases {unknown} are not among the phases {list(phases)}")
        self.phases = dict(phases)
        self.concurrent = tuple(concurrent)
        self.names = tuple(self.phases)
        self.device = torch.device(device)
        self.use_graphs = bool(use_graphs) and self.device.type == "cuda"
        self.warmup = max(1, int(warmup))
        self._state = state
        self._steps = 0
        self._whole: torch.cuda.CUDAGraph | None = None
        self._by_phase: list[tuple[str, torch.cuda.CUDAGraph]] = []
        self._kept: list[dict] = []

    @property
    def captured(self) -> bool:
        return self._whole is not None

    @property
    def state(self) -> object | None:
        """The object whose attributes the phases share (None if not given)."""
        return self._state

    def run(self, timer: PhaseTimer | None = None) -> None:
        """Run one step; with ``timer``, record each phase's start (and the step's end) in it."""
        if self.use_graphs and self._whole is None and self._steps >= self.warmup:
            self._capture()
        self._steps += 1
        if self._whole is None:
            self._run_eager(timer)
        elif timer is None:
            self._whole.replay()
        else:
            timer.begin()
            for name, graph in self._by_phase:
                timer.mark(name)
                graph.replay()
            timer.end()

    def _run_eager(self, timer: PhaseTimer | None) -> None:
        side = torch.cuda.Stream(self.device) if self.use_graphs else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            if timer is not None:
                timer.begin()
            for name, fn in self.phases.items():
                if timer is not None:
                    timer.mark(name)
                fn()
            if timer is not None:
                timer.end()
        if side is not None:
            torch.cuda.current_stream(self.device).wait_stream(side)

    def _capture(self) -> None:
        torch.cuda.synchronize(self.device)
        pool = torch.cuda.graph_pool_handle()
        for name, fn in self.phases.items():
            graph = torch.cuda.CUDAGraph()
            with warnings.catch_warnings():  # a phase may launch nothing (a step's upload of views)
                warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
                with capture(graph, pool=pool):
                    fn()
            self._by_phase.append((name, graph))
        if self._state is not None:
            self._kept.append(attributes_of(self._state))  # the phase graphs read these addresses
        whole = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(self.device)
        with capture(whole):
            main = torch.cuda.current_stream(self.device)
            for name, fn in self.phases.items():
                if name in self.concurrent:
                    side.wait_stream(main)  # forks the capture: a parallel branch of the graph
                    with torch.cuda.stream(side):
                        fn()
                else:
                    fn()
            if self.concurrent:
                main.wait_stream(side)  # joins it before the step ends
        self._whole = whole


def attributes_of(state: object) -> dict[str, object]:
    """What ``state``'s attributes hold now: its ``__dict__``, or a slotted dataclass's fields."""
    if hasattr(state, "__dict__"):
        return dict(vars(state))
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}

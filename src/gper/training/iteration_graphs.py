"""K collection iterations, with the training steps and target updates due in them, replayed as
one CUDA graph (``graph_iterations``).

A learner's step graphs (:class:`~gper.training.phases.PhasedStep`) make one iteration two graph
replays from the host: collect, then learn. Here K iterations become one: their phases (the
collect step's, the learn step's where a training step is due, and the target update where one is
due) are captured in order, as the host would have run them, into one graph per distinct schedule
of a block (which of its iterations train, which training steps update the target). Most runs
have one or a few such schedules; the first :data:`MAX_GRAPHS` are kept and a block of any other
runs iteration by iteration.

What stays the same: the host's schedule (it knows every block's from the settings), the epochs
(a block never crosses an epoch's end: the epoch's readback, report, evaluation and checkpoint
come where they did), the timed iterations (``time_every``: a block never holds one; it runs alone,
phase by phase), the episode ring (recorded on the device as before) and a stop signal (seen
after the block in progress). Torch's CUDA generator hands each captured draw the offset it
would have had in the iteration-by-iteration replays, as long as the phases draw in the same order.

On the CPU there are no graphs: a block runs its phases in the same order, one after the other,
which is what the iteration-by-iteration loop runs (the CPU tests check the two runs are equal).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

from gper.replay.graphs import capture
from gper.training.phases import attributes_of

#: distinct block schedules kept as graphs; a block of another schedule runs iteration by iteration
MAX_GRAPHS = 8


def unsupported(learner: object) -> str | None:
    """Why ``learner`` cannot run blocks of iterations (None: it can): it needs its step graphs
    (``collect`` and ``learn`` :class:`~gper.training.phases.PhasedStep`), ``update_target`` and
    ``target_update_due``; on CUDA both steps replayed from graphs (``cuda_graphs``, an
    environment whose step may be captured)."""
    for name in ("collect", "learn"):
        if not hasattr(getattr(learner, name, None), "phases"):
            return f"the learner has no {name} step of phases"
    for name in ("update_target", "target_update_due"):
        if not callable(getattr(learner, name, None)):
            return f"the learner has no {name}()"
    device = torch.device(learner.device)
    if device.type == "cuda" and not (learner.collect.use_graphs and learner.learn.use_graphs):
        return (
            "its collection or training step does not run from CUDA graphs (cuda_graphs off, or an "
            "environment whose step cannot be captured)"
        )
    return None


class IterationGraphs:
    """Blocks of ``k`` iterations of ``learner`` (see the module docstring).

    Args:
        learner: what collects and learns; :func:`unsupported` must have found nothing.
        k: iterations a block.
    """

    def __init__(self, learner: object, k: int) -> None:
        reason = unsupported(learner)
        if reason is not None:
            raise ValueError(f"graph_iterations: {reason}")
        self.learner, self.k = learner, int(k)
        self.cuda = torch.device(learner.device).type == "cuda"
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._kept: list[dict] = []  # what the learn state held at each capture: the graphs read it
        self._pool = None
        self._warned = False

    def ready(self) -> bool:
        """Whether blocks may run now: on CUDA once both step graphs are captured (past the warm-up
        the step graphs do eagerly: lazy initialisation, optimizer state), at once on the CPU."""
        return not self.cuda or (self.learner.collect.captured and self.learner.learn.captured)

    def schedule(self, trains: Sequence[bool], train_steps: int) -> tuple[tuple[bool, bool], ...]:
        """A block's schedule from which of its iterations train and the training steps done
        before it: per iteration (trains, target update due after its training step)."""
        out, step = [], train_steps
        for t in trains:
            step += t
            out.append((bool(t), bool(t) and bool(self.learner.target_update_due(step))))
        return tuple(out)

    def run(self, trains: Sequence[bool], train_steps: int) -> bool:
        """The block whose iterations train where ``trains`` says, after ``train_steps`` training
        steps; False (nothing run) when its schedule is not among the graphs and no more may be
        made: the caller runs it iteration by iteration."""
        key = self.schedule(trains, train_steps)
        if not self.cuda:
            self._phases(key, train_steps)()
            return True
        graph = self.graphs.get(key)
        if graph is None:
            if len(self.graphs) >= MAX_GRAPHS:
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"graph_iterations: this run's blocks have more than {MAX_GRAPHS} schedules; blocks of the "
                        "others run iteration by iteration (a K that divides target_every * train_every has fewer)",
                        stacklevel=2,
                    )
                return False
            graph = self.graphs[key] = self._capture(key, train_steps)
        graph.replay()
        return True

    def _phases(self, key: tuple[tuple[bool, bool], ...], train_steps: int) -> Callable[[], None]:
        learner = self.learner
        collect, learn = list(learner.collect.phases.values()), list(learner.learn.phases.values())

        def block() -> None:
            step = train_steps
            for trains, target in key:
                for fn in collect:
                    fn()
                if trains:
                    step += 1
                    for fn in learn:
                        fn()
                    if target:
                        learner.update_target(step)

        return block

    def _capture(self, key: tuple[tuple[bool, bool], ...], train_steps: int) -> torch.cuda.CUDAGraph:
        learn = self.learner.learn
        state = learn.state
        before = attributes_of(state) if state is not None else None
        device = torch.device(self.learner.device)
        torch.cuda.synchronize(device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
                with capture(graph, pool=self._pool):
                    self._phases(key, train_steps)()
            if state is not None:
                self._kept.append(attributes_of(state))  # the block graph reads these addresses
        finally:
            if state is not None:
                for name, value in before.items():  # the step graphs' tensors back where eager code finds them
                    setattr(state, name, value)
        return graph

"""PhasedStep: a step of named phases, eager on the CPU, whole and phase by phase as CUDA graphs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gper.training.phases import PhasedStep
from gper.training.timing import PhaseTimer

CPU = torch.device("cpu")


def test_phased_step_runs_phases_in_order_on_cpu():
    calls = []
    step = PhasedStep({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, CPU)
    timer = PhaseTimer(CPU)
    step.run()
    step.run(timer)
    assert calls == ["a", "b", "a", "b"]
    assert not step.captured  # no graphs on the CPU
    summary = timer.summary()
    assert set(summary) == {"a", "b"} and all(n == 1 and ms >= 0 for ms, n in summary.values())
    assert timer.summary() == {}  # read once


def test_phased_step_needs_a_phase():
    with pytest.raises(ValueError, match="at least one phase"):
        PhasedStep({}, CPU)


def test_phased_step_concurrent_phases_must_exist_and_run_in_order_eagerly():
    with pytest.raises(ValueError, match=r"concurrent phases \['c'\]"):
        PhasedStep({"a": lambda: None}, CPU, concurrent=("c",))
    calls = []
    step = PhasedStep({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, CPU, concurrent=("a",))
    step.run()
    assert calls == ["a", "b"]


@dataclass
class _State:
    mid: torch.Tensor | None = None


@dataclass(slots=True)
class _SlottedState:
    mid: torch.Tensor | None = None


@pytest.mark.gpu
@pytest.mark.parametrize("state_type", [_State, _SlottedState], ids=["dataclass", "slots"])
def test_phase_graphs_read_what_earlier_phases_left_in_a_dataclass(state_type):
    """A dataclass (plain or slotted) as the phases' shared state: one phase leaves a new tensor in
    it, the next reads it; the by-phase graphs and the whole-step graph compute what eager steps do."""
    x = torch.arange(4.0, device="cuda")
    out = torch.zeros(4, device="cuda")
    state = state_type()

    def double():
        state.mid = x * 2  # a new tensor each call: only the step keeps the captured one alive

    def add_one():
        out.copy_(state.mid + 1)

    step = PhasedStep({"double": double, "add_one": add_one}, torch.device("cuda"), state=state)
    for _ in range(step.warmup + 1):
        step.run()
    assert step.captured
    state.mid = None  # drop the phase's own reference: the graphs must not depend on it
    x += 1
    step.run(PhaseTimer(torch.device("cuda")))  # phase by phase
    torch.cuda.synchronize()
    assert out.tolist() == [3.0, 5.0, 7.0, 9.0]
    x += 1
    step.run()  # the whole step
    torch.cuda.synchronize()
    assert out.tolist() == [5.0, 7.0, 9.0, 11.0]

"""The kernel contract: both back ends define every :class:`gper.ops.ReplayKernels` function with
exactly its parameters, :func:`gper.ops.select_backend` picks one (or passes a module through), and
``triton_ops.launch_config`` changes launch shapes only inside its block."""

from __future__ import annotations

import dataclasses
import inspect
import types

import pytest
import torch

from gper._triton import HAS_TRITON
from gper.ops import BACKENDS, ReplayKernels, backend_module, cpu, reference, select_backend
from gper.ops.state import MODE_PROPORTIONAL, MODE_STRATIFIED
from gper.replay.tree import PriorityTree
from helpers import EPS_DYADIC, TRITON_ON_CPU, dyadic_td, sample_fresh

needs_interpreter = pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")

#: the functions of the contract, as the Protocol declares them
CONTRACT = sorted(
    name for name, member in vars(ReplayKernels).items() if inspect.isfunction(member) and not name.startswith("_")
)


def test_the_contract_lists_every_kernel():
    assert CONTRACT == [
        "add_commit",
        "add_positions",
        "add_rows",
        "make_add_plan",
        "make_claims",
        "rebuild",
        "recompute",
        "sample",
        "set_keys",
        "update",
    ]


def _parameters(fn) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values() if p.name != "self"]


#: every kernel module, on any machine with triton installed (nothing here launches a kernel)
MODULES = ["torch", "cpu", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="needs triton"))]


@pytest.mark.parametrize("name", CONTRACT)
@pytest.mark.parametrize("backend", MODULES)
def test_both_back_ends_define_each_function_with_the_protocols_parameters(backend, name):
    """Same names, same order, same kinds (keyword-only wherever the Protocol says so)."""
    module = cpu if backend == "cpu" else backend_module(backend)
    fn = getattr(module, name, None)
    assert callable(fn), f"{module.__name__} lacks {name}"
    want = _parameters(getattr(ReplayKernels, name))
    assert _parameters(fn) == want, f"{module.__name__}.{name}{inspect.signature(fn)}"


def test_every_kernel_is_keyword_only():
    for name in CONTRACT:
        kinds = {kind for _, kind in _parameters(getattr(ReplayKernels, name))}
        assert kinds == {inspect.Parameter.KEYWORD_ONLY}, name


def test_the_declared_list_is_the_protocol():
    from gper.ops import CONTRACT as declared

    assert set(declared) == set(CONTRACT)


def test_a_kernel_module_without_the_whole_contract_is_refused_at_construction():
    import gper

    partial = types.SimpleNamespace(**{n: getattr(backend_module("torch"), n) for n in CONTRACT if n != "set_keys"})
    with pytest.raises(TypeError, match=r"lacks the kernels \['set_keys'\]"):
        gper.PrioritizedReplayBuffer(8, {"x": ((), torch.float32)}, device="cpu", backend=partial)
    whole = types.SimpleNamespace(**{n: getattr(backend_module("torch"), n) for n in CONTRACT})
    rb = gper.PrioritizedReplayBuffer(8, {"x": ((), torch.float32)}, device="cpu", backend=whole)
    rb.add({"x": torch.arange(4.0)})
    assert rb.sample(4).indices.max() < 4


def test_select_backend_auto_picks_by_device(device):
    name, kernels = select_backend("auto", device)
    want = "triton" if device.type == "cuda" and HAS_TRITON else "torch"
    assert name == want and kernels is backend_module(want, device)


def test_select_backend_torch_is_the_reference_off_the_cpu_and_its_numpy_twin_on_it(device):
    want = cpu if device.type == "cpu" else reference
    assert select_backend("torch", device) == ("torch", want)
    assert backend_module("torch") is reference  # no device: the reference itself


@needs_interpreter
def test_select_backend_triton_on_cpu_needs_the_interpreter(monkeypatch):
    from gper.ops import triton_ops

    assert select_backend("triton", torch.device("cpu")) == ("triton", triton_ops)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="CUDA"):
        select_backend("triton", torch.device("cpu"))


def test_select_backend_triton_without_triton_is_an_import_error(monkeypatch):
    import gper._triton

    monkeypatch.setattr(gper._triton, "HAS_TRITON", False)
    with pytest.raises(ImportError, match=r'pip install "\.\[triton\]"'):
        select_backend("triton", torch.device("cpu"))
    # auto falls back to the torch back end
    assert select_backend("auto", torch.device("cpu")) == ("torch", cpu)


@pytest.mark.parametrize("name", ["cuda", "Torch", ""])
def test_unknown_backend_names_are_refused(name):
    with pytest.raises(ValueError, match="backend must be one of"):
        select_backend(name, torch.device("cpu"))
    with pytest.raises(ValueError, match="backend must be one of"):
        backend_module(name)
    assert BACKENDS == ("auto", "triton", "torch")


def test_a_module_is_passed_through_as_it_is():
    assert select_backend(reference, torch.device("cpu")) == ("gper.ops.reference", reference)
    custom = types.ModuleType("my_kernels")
    for fn in CONTRACT:  # a copy of the torch back end under another name (what an ablation passes)
        setattr(custom, fn, getattr(reference, fn))
    name, kernels = select_backend(custom, torch.device("cpu"))
    assert name == "my_kernels" and kernels is custom


@needs_triton
def test_launch_config_applies_inside_the_block_and_is_restored_after():
    from gper.ops import triton_ops

    before = dataclasses.replace(triton_ops.LAUNCH)
    with triton_ops.launch_config(sample_block=32, level_warps=2) as launch:
        assert launch is triton_ops.LAUNCH
        assert (launch.sample_block, launch.level_warps) == (32, 2)
        assert launch.update_block == before.update_block, "shapes not named keep their values"
    assert triton_ops.LAUNCH == before
    with pytest.raises(RuntimeError, match="inside"), triton_ops.launch_config(update_block=8):
        raise RuntimeError("inside")
    assert triton_ops.LAUNCH == before, "an exception inside the block restores the shapes too"


@needs_triton
def test_launch_config_refuses_unknown_names_and_changes_nothing():
    from gper.ops import triton_ops

    before = dataclasses.replace(triton_ops.LAUNCH)
    with pytest.raises(TypeError, match="unknown launch shapes.*'sample_blocks'"):
        with triton_ops.launch_config(sample_block=8, sample_blocks=8):
            pass
    assert triton_ops.LAUNCH == before


@needs_triton
@pytest.mark.parametrize("mode", [MODE_PROPORTIONAL, MODE_STRATIFIED])
def test_launch_shapes_do_not_change_results(device, mode):
    """Other block sizes split the same work over more programs: the same draws and the same tree
    (dyadic priorities, so no sum depends on the order a launch shape adds in)."""
    if device.type == "cpu" and not TRITON_ON_CPU:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    from gper.ops import triton_ops

    def run():
        t = PriorityTree.from_leaves([float(1 + i % 5) for i in range(100)], triton_ops, arity=4, device=device)
        idx = torch.arange(200, device=device) % 37
        td = dyadic_td(torch.arange(200) % 5 * 2 - 2).to(device)
        t.update(idx, td, None, 0.5, EPS_DYADIC)
        return (*sample_fresh(t, 150, mode, seed=4), t.tree.clone(), t.mintree.clone(), t.counters.clone())

    default = run()
    with triton_ops.launch_config(sample_block=4, sample_warps=1, update_block=16, level_block=8, level_warps=1):
        small = run()
    for a, b in zip(default, small, strict=True):
        assert torch.equal(a, b)

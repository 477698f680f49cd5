"""The kernel contract: every back end of a kernel family defines each function of the family with
one signature (for the tree, exactly the :class:`gper.ops.ReplayKernels` Protocol's; every kernel
that touches a tree takes its ``state``), :func:`gper.ops.kernels` picks a family's back end,
:func:`gper.ops.select_backend` picks the tree's (or passes a module through), and
``gper.ops.tree.triton.launch_config`` changes launch shapes only inside its block."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types

import pytest
import torch

from gper._triton import HAS_TRITON
from gper.ops import BACKENDS, FAMILIES, ReplayKernels, kernels, select_backend
from gper.ops.state import MODE_PROPORTIONAL, MODE_STRATIFIED
from gper.ops.tree import cpu, reference
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


#: every back-end module of each family, on any machine with triton installed (nothing here launches a kernel)
BACK_ENDS = {
    "tree": ["reference", "cpu", "triton"],
    "trajectory": ["reference", "triton"],
    "her": ["reference", "triton"],
    "shard": ["reference", "triton"],
}
#: parameters a Triton twin takes beyond the family's signature: the trajectory add reads the
#: step from the caller's own tensors by a word plan (``staged=None``), which the reference does not
TRITON_EXTRAS = {("trajectory", "stream_add"): ["sources", "plan", "flags"]}


def _family_contract(family: str) -> tuple[str, ...]:
    return importlib.import_module(f"gper.ops.{family}").CONTRACT


def test_every_family_has_its_back_ends_listed():
    assert set(BACK_ENDS) == set(FAMILIES)


@pytest.mark.parametrize(
    ("family", "backend"),
    [
        pytest.param(f, b, marks=[pytest.mark.skipif(not HAS_TRITON, reason="needs triton")] if b == "triton" else [])
        for f, backends in BACK_ENDS.items()
        for b in backends
    ],
)
def test_each_back_end_defines_every_function_of_its_family_with_one_signature(family, backend):
    """Same names, same order, same kinds (keyword-only), for every function of the family: the
    tree's as the Protocol declares them, the other families' as their reference defines them."""
    module = importlib.import_module(f"gper.ops.{family}.{backend}")
    reference_module = importlib.import_module(f"gper.ops.{family}.reference")
    for name in _family_contract(family):
        fn = getattr(module, name, None)
        assert callable(fn), f"{module.__name__} lacks {name}"
        declared = getattr(ReplayKernels, name) if family == "tree" else getattr(reference_module, name)
        want = _parameters(declared)
        got = _parameters(fn)
        extras = TRITON_EXTRAS.get((family, name), []) if backend == "triton" else []
        assert [p for p in got if p[0] not in extras] == want, f"{module.__name__}.{name}{inspect.signature(fn)}"
        assert {kind for _, kind in got} <= {inspect.Parameter.KEYWORD_ONLY}, f"{module.__name__}.{name}"


def test_every_tree_touching_kernel_takes_the_tree_state_and_no_loose_tree_tensor():
    loose = {"tree", "mintree", "layout", "gen", "claims", "counters", "scalars"}
    for family in FAMILIES:
        reference_module = importlib.import_module(f"gper.ops.{family}.reference")
        for name in _family_contract(family):
            params = {p for p, _ in _parameters(getattr(reference_module, name))}
            if name == "make_claims":  # it makes a tensor of the state: it takes the layout
                continue
            assert not params & loose, f"{family}.{name} takes {sorted(params & loose)}: pass state=TreeState"


def test_every_kernel_is_keyword_only():
    for name in CONTRACT:
        kinds = {kind for _, kind in _parameters(getattr(ReplayKernels, name))}
        assert kinds == {inspect.Parameter.KEYWORD_ONLY}, name


def test_the_declared_list_is_the_protocol():
    from gper.ops import CONTRACT as declared

    assert set(declared) == set(CONTRACT)


def test_a_kernel_module_without_the_whole_contract_is_refused_at_construction():
    import gper

    partial = types.SimpleNamespace(**{n: getattr(kernels("tree", "torch"), n) for n in CONTRACT if n != "set_keys"})
    with pytest.raises(TypeError, match=r"lacks the kernels \['set_keys'\]"):
        gper.PrioritizedReplayBuffer(8, {"x": ((), torch.float32)}, device="cpu", backend=partial)
    whole = types.SimpleNamespace(**{n: getattr(kernels("tree", "torch"), n) for n in CONTRACT})
    rb = gper.PrioritizedReplayBuffer(8, {"x": ((), torch.float32)}, device="cpu", backend=whole)
    rb.add({"x": torch.arange(4.0)})
    assert rb.sample(4).indices.max() < 4


def test_select_backend_auto_picks_by_device(device):
    name, chosen = select_backend("auto", device)
    want = "triton" if device.type == "cuda" and HAS_TRITON else "torch"
    assert name == want and chosen is kernels("tree", want, device)


def test_select_backend_torch_is_the_reference_off_the_cpu_and_its_numpy_twin_on_it(device):
    want = cpu if device.type == "cpu" else reference
    assert select_backend("torch", device) == ("torch", want)
    assert kernels("tree", "torch") is reference  # no device: the reference itself
    for family in FAMILIES[1:]:  # the other families have no CPU twin
        assert kernels(family, "torch", device).__name__ == f"gper.ops.{family}.reference"


@needs_interpreter
def test_select_backend_triton_on_cpu_needs_the_interpreter(monkeypatch):
    from gper.ops.tree import triton as tree_triton

    assert select_backend("triton", torch.device("cpu")) == ("triton", tree_triton)
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
        kernels("tree", name)
    assert BACKENDS == ("auto", "triton", "torch")


def test_a_module_is_passed_through_as_it_is():
    assert select_backend(reference, torch.device("cpu")) == ("gper.ops.tree.reference", reference)
    custom = types.ModuleType("my_kernels")
    for fn in CONTRACT:  # a copy of the torch back end under another name (what an ablation passes)
        setattr(custom, fn, getattr(reference, fn))
    name, chosen = select_backend(custom, torch.device("cpu"))
    assert name == "my_kernels" and chosen is custom


@needs_triton
def test_launch_config_applies_inside_the_block_and_is_restored_after():
    from gper.ops.tree import triton as tree_triton

    before = dataclasses.replace(tree_triton.LAUNCH)
    with tree_triton.launch_config(sample_block=32, level_warps=2) as launch:
        assert launch is tree_triton.LAUNCH
        assert (launch.sample_block, launch.level_warps) == (32, 2)
        assert launch.update_block == before.update_block, "shapes not named keep their values"
    assert tree_triton.LAUNCH == before
    with pytest.raises(RuntimeError, match="inside"), tree_triton.launch_config(update_block=8):
        raise RuntimeError("inside")
    assert tree_triton.LAUNCH == before, "an exception inside the block restores the shapes too"


@needs_triton
def test_launch_config_refuses_unknown_names_and_changes_nothing():
    from gper.ops.tree import triton as tree_triton

    before = dataclasses.replace(tree_triton.LAUNCH)
    with pytest.raises(TypeError, match="unknown launch shapes.*'sample_blocks'"):
        with tree_triton.launch_config(sample_block=8, sample_blocks=8):
            pass
    assert tree_triton.LAUNCH == before


@needs_triton
@pytest.mark.parametrize("mode", [MODE_PROPORTIONAL, MODE_STRATIFIED])
def test_launch_shapes_do_not_change_results(device, mode):
    """Other block sizes split the same work over more programs: the same draws and the same tree
    (dyadic priorities, so no sum depends on the order a launch shape adds in)."""
    if device.type == "cpu" and not TRITON_ON_CPU:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    from gper.ops.tree import triton as tree_triton

    def run():
        t = PriorityTree.from_leaves([float(1 + i % 5) for i in range(100)], tree_triton, arity=4, device=device)
        idx = torch.arange(200, device=device) % 37
        td = dyadic_td(torch.arange(200) % 5 * 2 - 2).to(device)
        t.update(idx, td, None, 0.5, EPS_DYADIC)
        return (*sample_fresh(t, 150, mode, seed=4), t.tree.clone(), t.mintree.clone(), t.counters.clone())

    default = run()
    with tree_triton.launch_config(sample_block=4, sample_warps=1, update_block=16, level_block=8, level_warps=1):
        small = run()
    for a, b in zip(default, small, strict=True):
        assert torch.equal(a, b)

"""Bad input gets a clear error and changes nothing.

Every case checks the exception type, that the message names the offending argument or field and
what was expected, and that the buffer's whole state (every tensor of ``state_dict()``, ``len``,
the seed) is bit-for-bit what it was. Tensors on the "meta" device stand in for "another device"
on a machine without a GPU.

The buffer cases run on the CPU and, through the device fixture, on CUDA, where ``strict=True``
makes index ranges raise as they always do on the CPU (without it, out-of-range entries are
dropped on the device and counted: the last test here).
"""

from __future__ import annotations

import math

import pytest
import torch

import gper
from helpers import SPEC, TRITON_ON_CPU, assert_unchanged, filled_wide_buffer, make_buffer, snapshot, transitions

META = torch.device("meta")


def checked_buffer(capacity: int, backend: str, device: torch.device, **kw):
    """A buffer that checks index ranges at once on any device (strict on CUDA)."""
    return make_buffer(capacity, backend, device, strict=device.type == "cuda", **kw)


@pytest.fixture
def rb(backend, device):
    """A buffer with some history: wrapped around, priorities updated, RNG counter advanced."""
    rb = checked_buffer(10, backend, device, arity=4, alpha=1.0, eps=0.5, seed=3)
    rb.add(transitions(13))
    rb.update_priorities(rb.sample(8), torch.arange(8.0, device=device))
    return rb


def on_device(rb, x):
    """A CPU tensor of a case moved to the buffer's device (other cases as they are)."""
    return x.to(rb.device) if isinstance(x, torch.Tensor) and x.device.type == "cpu" else x


def expect_error(rb, call, exc, *words):
    # a message that names the buffer's device says "cpu" on the CPU, "cuda:0" on CUDA
    words = [str(rb.device) if w == "cpu" else w for w in words]
    before = snapshot(rb)
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for word in words:
        assert word in msg, f"{exc.__name__} message {msg!r} does not mention {word!r}"
    assert_unchanged(rb, before)


def batch_with(**changes):
    data = transitions(4)
    for k, v in changes.items():
        if v is None:
            del data[k]
        else:
            data[k] = v
    return data


ADD_CASES = {
    "not a mapping": ([transitions(4)["obs"]], TypeError, ["mapping", "list"]),
    "missing field": (batch_with(done=None), KeyError, ["missing", "done"]),
    "extra field": (batch_with(reward=torch.zeros(4)), KeyError, ["unexpected", "reward"]),
    "not a tensor": (batch_with(action=[1, 2, 3, 4]), TypeError, ["action", "Tensor"]),
    "wrong dtype": (batch_with(obs=torch.zeros(4, 3, dtype=torch.float64)), TypeError, ["obs", "float64", "float32"]),
    "wrong bool dtype": (batch_with(done=torch.zeros(4, dtype=torch.uint8)), TypeError, ["done", "torch.bool"]),
    "wrong shape": (batch_with(obs=torch.zeros(4, 4)), ValueError, ["obs", "(4, 4)", "(n, 3)"]),
    "missing item dim": (batch_with(obs=torch.zeros(3)), ValueError, ["obs", "(n, 3)"]),
    "extra dim on scalar": (batch_with(action=torch.zeros(4, 1, dtype=torch.int64)), ValueError, ["action", "(n,)"]),
    "0-d scalar": (batch_with(action=torch.tensor(1)), ValueError, ["action", "(n,)"]),
    "ragged batch": (batch_with(action=torch.zeros(5, dtype=torch.int64)), ValueError, ["action", "5", "4"]),
    "other device": (batch_with(obs=torch.zeros(4, 3, device=META)), ValueError, ["obs", "meta", "cpu"]),
    "empty batch": (transitions(0), ValueError, ["empty"]),
}


@pytest.mark.parametrize("case", list(ADD_CASES))
def test_add_rejects(rb, case):
    data, exc, words = ADD_CASES[case]
    expect_error(rb, lambda: rb.add(data), exc, *words)


@pytest.mark.parametrize(
    "size, exc, words",
    [
        (0, ValueError, ["batch_size", ">= 1", "0"]),
        (-3, ValueError, ["batch_size", ">= 1"]),
        (2.0, TypeError, ["batch_size", "int", "float"]),
        (True, TypeError, ["batch_size", "int", "bool"]),
        ("4", TypeError, ["batch_size", "int", "str"]),
        (None, TypeError, ["batch_size", "int"]),
    ],
)
def test_sample_rejects_batch_size(rb, size, exc, words):
    expect_error(rb, lambda: rb.sample(size), exc, *words)


@pytest.mark.parametrize(
    "beta, exc, words",
    [
        (1.5, ValueError, ["beta", "[0, 1]", "1.5"]),
        (-0.1, ValueError, ["beta", "[0, 1]"]),
        (math.nan, ValueError, ["beta", "[0, 1]"]),
        ("0.5", TypeError, ["beta", "float", "str"]),
        (True, TypeError, ["beta", "float", "bool"]),
        (torch.tensor([0.5]), ValueError, ["beta", "0-d", "(1,)"]),
        (torch.tensor(1), ValueError, ["beta", "0-d", "int64"]),
        (torch.tensor(0.5, device=META), ValueError, ["beta", "meta", "cpu"]),
    ],
)
def test_sample_rejects_beta(rb, beta, exc, words):
    expect_error(rb, lambda: rb.sample(4, beta=beta), exc, *words)


def test_sample_from_empty_buffer(backend, device):
    rb = make_buffer(10, backend, device)
    expect_error(rb, lambda: rb.sample(4), RuntimeError, "empty", "add()")


IDX_CASES = {
    "list": ([0, 1], TypeError, ["indices", "torch.Tensor", "list"]),
    "2-D": (torch.zeros(2, 2, dtype=torch.int64), ValueError, ["indices", "1-D", "(2, 2)"]),
    "0-d": (torch.tensor(1), ValueError, ["indices", "1-D"]),
    "empty": (torch.zeros(0, dtype=torch.int64), ValueError, ["indices", "empty"]),
    "float": (torch.tensor([0.0, 1.0]), TypeError, ["indices", "int64", "float32"]),
    "other device": (torch.tensor([0, 1], device=META), ValueError, ["indices", "meta", "cpu"]),
    "negative": (torch.tensor([0, -1]), IndexError, ["-1", "out of range", "[0, 10)"]),
    "past size": (torch.tensor([3, 10]), IndexError, ["10", "out of range", "[0, 10)"]),
}


@pytest.mark.parametrize("case", list(IDX_CASES))
def test_update_rejects_indices(rb, case):
    idx, exc, words = IDX_CASES[case]
    idx, td = on_device(rb, idx), torch.ones(2, device=rb.device)
    expect_error(rb, lambda: rb.update_priorities(idx, td), exc, "update_priorities()", *words)


@pytest.mark.parametrize("case", ["list", "2-D", "empty", "float", "other device", "negative", "past size"])
def test_priorities_rejects_indices(rb, case):
    idx, exc, words = IDX_CASES[case]
    idx = on_device(rb, idx)
    expect_error(rb, lambda: rb.priorities(idx), exc, "priorities()", *words)


def test_index_past_size_before_wrap(backend, device):
    """A slot not yet written is out of range even though it is below capacity."""
    rb = checked_buffer(10, backend, device)
    rb.add(transitions(4))
    idx, td = torch.tensor([4], device=device), torch.ones(1, device=device)
    expect_error(rb, lambda: rb.update_priorities(idx, td), IndexError, "[0, 4)")


TD_CASES = {
    "list": ([1.0, 2.0], TypeError, ["td_errors", "torch.Tensor"]),
    "int": (torch.tensor([1, 2]), TypeError, ["td_errors", "floating", "int64"]),
    "bool": (torch.tensor([True, False]), TypeError, ["td_errors", "floating"]),
    "short": (torch.ones(1), ValueError, ["td_errors", "(1,)", "(2,)"]),
    "long": (torch.ones(3), ValueError, ["td_errors", "(3,)", "(2,)"]),
    "column": (torch.ones(2, 1), ValueError, ["td_errors", "(2, 1)", "(2,)"]),
    "other device": (torch.ones(2, device=META), ValueError, ["td_errors", "meta", "cpu"]),
}


@pytest.mark.parametrize("case", list(TD_CASES))
def test_update_rejects_td_errors(rb, case):
    td, exc, words = TD_CASES[case]
    idx = torch.tensor([0, 1], device=rb.device)
    expect_error(rb, lambda: rb.update_priorities(idx, td), exc, "update_priorities()", *words)


@pytest.mark.parametrize("case", ["short", "int", "other device"])
def test_update_with_batch_rejects_td_errors(rb, case):
    td, exc, words = TD_CASES[case]
    batch = rb.sample(2)
    expect_error(rb, lambda: rb.update_priorities(batch, td), exc, *words)


def test_update_rejects_batch_with_mismatched_generations(rb):
    batch = rb.sample(3)
    batch.generations = batch.generations[:2]
    expect_error(rb, lambda: rb.update_priorities(batch, torch.ones(3, device=rb.device)), ValueError, "generations")


CTOR_CASES = [
    ({"capacity": 0}, ValueError, ["capacity", ">= 1", "0"]),
    ({"capacity": -5}, ValueError, ["capacity", ">= 1"]),
    ({"capacity": 1.5}, TypeError, ["capacity", "int", "float"]),
    ({"capacity": True}, TypeError, ["capacity", "int", "bool"]),
    ({"capacity": "10"}, TypeError, ["capacity", "int"]),
    ({"alpha": -0.1}, ValueError, ["alpha", "[0, 1]"]),
    ({"alpha": 1.1}, ValueError, ["alpha", "[0, 1]", "1.1"]),
    ({"alpha": math.nan}, ValueError, ["alpha"]),
    ({"alpha": "0.6"}, TypeError, ["alpha", "float"]),
    ({"beta": 2}, ValueError, ["beta", "[0, 1]"]),
    ({"beta": -1e-9}, ValueError, ["beta", "[0, 1]"]),
    ({"eps": 0.0}, ValueError, ["eps", "positive"]),
    ({"eps": -1e-6}, ValueError, ["eps", "positive"]),
    ({"eps": math.inf}, ValueError, ["eps", "finite"]),
    ({"eps": math.nan}, ValueError, ["eps"]),
    ({"sampling": "prioritized"}, ValueError, ["sampling", "proportional", "stratified", "rank", "uniform"]),
    ({"weight_norm": "max"}, ValueError, ["weight_norm", "global", "batch", "'max'"]),
    ({"backend": "cuda"}, ValueError, ["backend", "triton", "torch", "'cuda'"]),
    ({"seed": -1}, ValueError, ["seed", "2**63"]),
    ({"seed": 2**63}, ValueError, ["seed"]),
    ({"seed": 1.0}, ValueError, ["seed", "int"]),
    ({"rank_refresh_interval": 0}, ValueError, ["rank_refresh_interval", ">= 1"]),
    ({"rank_refresh_interval": 2.5}, ValueError, ["rank_refresh_interval"]),
    ({"arity": 3}, ValueError, ["arity", "power of two"]),
    ({"arity": 1}, ValueError, ["arity"]),
    ({"arity": 4.0}, TypeError, ["arity", "int", "4.0"]),
    ({"eps": 1e-46}, ValueError, ["eps", "normal", "float32"]),
    ({"eps": 1e39}, ValueError, ["eps", "2**64"]),
    ({"spec": {"obs": ((True,), torch.float32)}}, ValueError, ["obs", "positive ints", "True"]),
    ({"spec": {"obs": (True, torch.float32)}}, ValueError, ["obs", "positive ints"]),
    ({"spec": {"obs": ((3,), torch.uint16)}}, TypeError, ["obs", "dtype", "uint16", "float32"]),
    ({"spec": {"obs": ((3,), torch.uint32)}}, TypeError, ["obs", "dtype", "uint32"]),
    ({"spec": {"obs": ((3,), torch.uint64)}}, TypeError, ["obs", "dtype", "uint64"]),
    ({"spec": {"obs": ((3,), torch.float8_e4m3fn)}}, TypeError, ["obs", "dtype", "float8"]),
    ({"spec": {"obs": ((3,), torch.float8_e5m2)}}, TypeError, ["obs", "dtype", "float8"]),
    ({"spec": {"obs": ((3,), torch.qint8)}}, TypeError, ["obs", "dtype", "qint8"]),
    ({"spec": {"obs": ((3,), torch.quint8)}}, TypeError, ["obs", "dtype", "quint8"]),
    ({"spec": {}}, ValueError, ["spec", "non-empty"]),
    ({"spec": {"obs": ((0,), torch.float32)}}, ValueError, ["obs", "positive"]),
    ({"spec": {"obs": ((3,), "float32")}}, TypeError, ["obs", "dtype"]),
    ({"spec": {"obs": ((3,), torch.complex64)}}, TypeError, ["obs", "dtype"]),
    ({"spec": {"obs": (3,)}}, TypeError, ["obs", "(shape, dtype)"]),
    ({"spec": {"": ((3,), torch.float32)}}, TypeError, ["spec keys", "non-empty"]),
    ({"spec": [("obs", ((3,), torch.float32))]}, ValueError, ["spec", "mapping"]),
]


@pytest.mark.parametrize("kw, exc, words", CTOR_CASES, ids=[str(c[0]) for c in CTOR_CASES])
def test_constructor_rejects(kw, exc, words):
    args = {"capacity": 10, "spec": SPEC, "device": "cpu", **kw}
    with pytest.raises(exc) as info:
        gper.PrioritizedReplayBuffer(**args)
    for word in words:
        assert word in str(info.value), f"{info.value!r} does not mention {word!r}"


def test_bool_is_not_an_interval():
    """``rank_refresh_interval=True`` is rejected like ``capacity=True`` and ``seed=True``."""
    with pytest.raises((TypeError, ValueError), match="rank_refresh_interval"):
        gper.PrioritizedReplayBuffer(10, SPEC, device="cpu", sampling="rank", rank_refresh_interval=True)


@pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton")
def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="CUDA"):
        gper.PrioritizedReplayBuffer(10, SPEC, device="cpu", backend="triton")


def test_auto_backend_follows_the_device(device):
    """Triton on CUDA (when installed), torch on the CPU; the device is canonical (``cuda:N``)."""
    from gper._triton import HAS_TRITON

    rb = gper.PrioritizedReplayBuffer(10, SPEC, device=device)
    assert rb.backend == ("triton" if device.type == "cuda" and HAS_TRITON else "torch")
    assert rb.device.type == device.type and (device.type == "cpu" or rb.device.index is not None)


def test_auto_backend_on_cpu_is_torch():
    rb = gper.PrioritizedReplayBuffer(10, SPEC, device="cpu")
    assert rb.backend == "torch" and rb.device == torch.device("cpu")
    assert "capacity=10" in repr(rb) and "torch" in repr(rb)


def test_good_call_after_rejected_calls_behaves_as_if_they_never_happened(backend, device):
    """Rejected calls leave no trace: the next samples equal those of a buffer that never saw them."""
    clean = checked_buffer(10, backend, device, seed=2)
    clean.add(transitions(7))
    dirty = checked_buffer(10, backend, device, seed=2)
    dirty.add(transitions(7))
    idx, past_size = torch.tensor([0, 1], device=device), torch.tensor([0, 9], device=device)
    for bad in [
        lambda: dirty.add(batch_with(obs=torch.zeros(4, 4))),
        lambda: dirty.sample(0),
        lambda: dirty.sample(4, beta=3.0),
        lambda: dirty.update_priorities(past_size, torch.ones(2, device=device)),
        lambda: dirty.update_priorities(idx, torch.ones(3, device=device)),
    ]:
        with pytest.raises((TypeError, ValueError, IndexError, KeyError)):
            bad()
    assert torch.equal(clean.sample(16).indices, dirty.sample(16).indices)


@pytest.mark.gpu
def test_invalid_indices_dropped_on_device_and_reported():
    """On CUDA without ``strict`` nothing syncs to check a range: bad entries are dropped on the
    device, counted, and reported by ``stats()``; with ``strict`` they raise."""
    rb = filled_wide_buffer(1000)
    before = rb.priorities(torch.arange(1000, device="cuda")).clone()
    rb.update_priorities(torch.tensor([5, 2000, -1], device="cuda"), torch.tensor([3.0, 1.0, 1.0], device="cuda"))
    with pytest.warns(gper.GperWarning, match="2 update entries"):
        st = rb.stats()
    assert st["invalid_indices"] == 2
    after = rb.priorities(torch.arange(1000, device="cuda"))
    changed = (after != before).nonzero().flatten().tolist()
    assert changed == [5]
    strict = filled_wide_buffer(1000, strict=True)
    with pytest.raises(IndexError):
        strict.update_priorities(torch.tensor([2000], device="cuda"), torch.ones(1, device="cuda"))

"""Restores that cannot corrupt a buffer: ``load_state_dict`` and ``load`` check everything that
can be checked before copying anything, refuse a corrupt state with an error that names what is
wrong and leave the buffer as it was; batches drawn before a restore are stale after it; buffer
files are written atomically and read without unpickling; copies and pickles rebuild the buffer."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

import gper
from gper.ops.state import C_CURSOR, C_RNG, C_SIZE, C_STALE, C_TICKET, S_BETA, S_MAXP
from gper.replay import files
from helpers import assert_unchanged, assert_verbose_equal, make_buffer, snapshot, transitions


def used(backend="torch", device="cpu", sampling="proportional", n=30, capacity=50, **kw):
    rb = make_buffer(capacity, backend, device, arity=4, sampling=sampling, seed=5, **kw)
    rb.add(transitions(n, device=device))
    batch = rb.sample(16)
    rb.update_priorities(batch, torch.linspace(-2, 3, 16, device=rb.device))
    return rb


def state_of(rb) -> dict:
    return {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in rb.state_dict().items()}


def _leaf(rb, i):
    return rb.tree.layout.leaf_offset + i


# (what the corruption is, a function that corrupts a state of `used()` in place, words of the error)
CORRUPTIONS = [
    ("size > capacity", lambda s, rb: s["counters"].__setitem__(C_SIZE, 51), "size"),
    ("negative size", lambda s, rb: s["counters"].__setitem__(C_SIZE, -1), "size"),
    ("cursor out of range", lambda s, rb: s["counters"].__setitem__(C_CURSOR, 50), "cursor"),
    ("negative cursor", lambda s, rb: s["counters"].__setitem__(C_CURSOR, -3), "cursor"),
    ("cursor != size before full", lambda s, rb: s["counters"].__setitem__(C_CURSOR, 7), "cursor differs"),
    ("negative RNG offset", lambda s, rb: s["counters"].__setitem__(C_RNG, -1), "negative"),
    ("negative stale count", lambda s, rb: s["counters"].__setitem__(C_STALE, -1), "negative"),
    ("ticket left set", lambda s, rb: s["counters"].__setitem__(C_TICKET, 3), "scratch"),
    ("negative priority", lambda s, rb: s["tree"].__setitem__(_leaf(rb, 3), -1.0), "negative"),
    ("NaN priority", lambda s, rb: s["tree"].__setitem__(_leaf(rb, 3), math.nan), "NaN"),
    ("inf priority", lambda s, rb: s["tree"].__setitem__(_leaf(rb, 3), math.inf), "infinite"),
    ("priority above 2**64", lambda s, rb: s["tree"].__setitem__(_leaf(rb, 3), 2.0**65), "2**64"),
    ("zero priority on a filled slot", lambda s, rb: s["tree"].__setitem__(_leaf(rb, 3), 0.0), "priority 0"),
    ("subnormal priority", lambda s, rb: s["tree"].__setitem__(_leaf(rb, 3), 1e-40), "below 2**-126"),
    ("mass on a slot never filled", lambda s, rb: s["tree"].__setitem__(_leaf(rb, 40), 0.5), "never filled"),
    ("max priority NaN", lambda s, rb: s["scalars"].__setitem__(S_MAXP, math.nan), "max priority"),
    ("max priority 0", lambda s, rb: s["scalars"].__setitem__(S_MAXP, 0.0), "max priority"),
    ("max priority below a priority", lambda s, rb: s["scalars"].__setitem__(S_MAXP, 1e-3), "exceeds the max"),
    ("beta out of range", lambda s, rb: s["scalars"].__setitem__(S_BETA, 2.0), "beta"),
    ("inner node off its leaves", lambda s, rb: s["tree"].__setitem__(rb.tree.layout.offsets[-2], 1e3), "inner node"),
    ("min tree off its leaves", lambda s, rb: s["mintree"].__setitem__(rb.tree.layout.offsets[0], 1e-9), "min tree"),
    ("min leaf differs", lambda s, rb: s["mintree"].__setitem__(_leaf(rb, 2), 1e-9), "min tree"),
    ("padding not 0", lambda s, rb: s["tree"].__setitem__(rb.tree.layout.offsets[-1] + 50, 1.0), "padding"),
    ("generation of an empty slot", lambda s, rb: s["gen"].__setitem__(45, 2), "generation"),
    ("generation 0 of a filled slot", lambda s, rb: s["gen"].__setitem__(4, 0), "generation"),
    ("host size above device size", lambda s, rb: s["host"].__setitem__("size", 40), "host size"),
    ("host size negative", lambda s, rb: s["host"].__setitem__("size", -1), "size"),
    ("host size not an int", lambda s, rb: s["host"].__setitem__("size", 3.0), "size"),
]


@pytest.mark.parametrize("what, corrupt, words", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_a_corrupt_state_is_refused_and_changes_nothing(device, backend, what, corrupt, words):
    source = used(backend, device)
    state = state_of(source)
    corrupt(state, source)
    target = used(backend, device, n=12)  # another state, which must survive the refused load
    before = snapshot(target)
    with pytest.raises(ValueError, match="load_state_dict") as info:
        target.load_state_dict(state)
    assert words in str(info.value), f"{what}: {info.value}"
    assert_unchanged(target, before)


def test_rank_keys_are_checked(device):
    source = used(device=device, sampling="rank")
    for key_value, slot in [(math.nan, 3), (-1.0, 3), (2.0, 45)]:
        state = state_of(source)
        state["key"][slot] = key_value
        target = used(device=device, sampling="rank", n=12)
        before = snapshot(target)
        with pytest.raises(ValueError, match="rank key"):
            target.load_state_dict(state)
        assert_unchanged(target, before)


@pytest.mark.parametrize("alpha, eps", [(0.6, 1e-6), (0.0, 1e-6), (1.0, 2.0**-126), (0.5, 2.0**64)])
def test_every_state_a_buffer_reaches_loads(device, backend, alpha, eps):
    """The checks accept what buffers really hold: full, wrapped, each mode, rank refreshes, after
    many updates with huge, zero and non-finite TD errors, alpha 0 to 1, eps at both limits."""
    for sampling in ("proportional", "stratified", "rank", "uniform"):
        rb = used(backend, device, sampling, n=130, alpha=alpha, eps=eps, rank_refresh_interval=2)
        g = torch.Generator().manual_seed(0)
        for step in range(7):
            batch = rb.sample(32)
            td = torch.randn(32, generator=g) * 10.0 ** (step - 2)
            td[:3] = torch.tensor([0.0, float("nan"), 3e38])
            rb.update_priorities(batch, td.to(device))
            if step == 3:
                rb.add(transitions(9, device=device))
        fresh = make_buffer(50, backend, device, arity=4, sampling=sampling, alpha=alpha, eps=eps)
        fresh.load_state_dict(state_of(rb))
        assert len(fresh) == 50 and fresh.stats() == rb.stats(), sampling


def test_a_batch_drawn_before_a_load_is_stale_after_it(device):
    rb = used(device=device)
    state = state_of(rb)
    batch = rb.sample(8)
    rb.load_state_dict(state)  # same contents, same generations: only the load tells them apart
    before = rb.priorities(batch.indices).clone()
    stale = rb.stats()["stale_updates"]
    rb.update_priorities(batch, torch.full((8,), 100.0, device=rb.device))
    assert rb.stats()["stale_updates"] == stale + 8
    assert torch.equal(rb.priorities(batch.indices), before), "a stale batch changed priorities"
    fresh = rb.sample(8)  # a batch drawn after the load updates as usual
    rb.update_priorities(fresh, torch.full((8,), 100.0, device=rb.device))
    assert rb.stats()["stale_updates"] == stale + 8


def test_a_batch_drawn_before_loading_a_smaller_state_is_stale_not_out_of_range(device):
    small = used(device=device, n=4)
    state = state_of(small)
    rb = used(device=device, n=50)
    batch = rb.sample(16)
    rb.load_state_dict(state)  # 4 slots now: the batch's indices reach past them
    stale = rb.stats()["stale_updates"]
    rb.update_priorities(batch, torch.ones(16, device=rb.device))
    assert rb.stats()["stale_updates"] == stale + 16


def test_the_seed_is_fixed():
    rb = used()
    with pytest.raises(AttributeError):
        rb.seed = 2**64
    assert rb.seed == 5


def test_a_batch_of_another_buffer_is_stale(device):
    a, b = used(device=device), used(device=device)
    batch = a.sample(8)
    before = snapshot(b)
    b.update_priorities(batch, torch.ones(8, device=b.device))
    assert b.stats()["stale_updates"] == before["counters"][C_STALE] + 8


def test_loading_tensors_that_require_grad_keeps_the_buffer_out_of_autograd(device):
    rb = used(device=device)
    state = state_of(rb)
    for name in ("tree", "mintree", "scalars"):
        state[name] = state[name].requires_grad_()
    fresh = make_buffer(50, "torch" if device.type == "cpu" else "triton", device, arity=4)
    fresh.load_state_dict(state)
    for name, t in fresh.state_dict().items():
        if isinstance(t, torch.Tensor):
            assert not t.requires_grad and t.grad_fn is None, name
    assert not fresh.sample(4).weights.requires_grad


# ---------------------------------------------------------------------------- files


def test_save_and_load_a_file(tmp_path, device, backend):
    rb = used(backend, device, sampling="rank", n=70)
    path = tmp_path / "replay.safetensors"
    n = rb.save(path)
    assert path.stat().st_size == n and not list(tmp_path.glob(".tmp-*"))
    fresh = make_buffer(50, backend, device, arity=4, sampling="rank")
    fresh.load(path)
    assert fresh.stats() == rb.stats() and fresh.seed == rb.seed
    for name, view in rb.storage.items():
        assert torch.equal(fresh.storage[name], view), name
    a, b = rb.sample(32), fresh.sample(32)
    assert_verbose_equal(a.indices, b.indices, what="indices")
    assert_verbose_equal(a.rows, b.rows, what="rows")
    assert_verbose_equal(a.weights, b.weights, what="weights")


def test_a_buffer_file_is_a_plain_safetensors_file(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    rb = used()
    rb.save(tmp_path / "b.safetensors")
    got = safetensors.load_file(tmp_path / "b.safetensors")
    size = len(rb)
    for name, t in rb.state_dict().items():
        if isinstance(t, torch.Tensor):
            # rows and generations of the filled slots only (the file costs what the buffer holds)
            want = t[:size] if name in ("rows", "gen") else t
            assert torch.equal(got[name], want.cpu()), name


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_partly_filled_buffer_file_costs_what_it_holds(tmp_path, backend):
    spec = {"obs": ((51,), torch.float32), "next_obs": ((51,), torch.float32), "action": ((), torch.int64)}
    rb = gper.PrioritizedReplayBuffer(100_000, spec, device="cpu", backend=backend, seed=3)
    n = 300
    rb.add({"obs": torch.randn(n, 51), "next_obs": torch.randn(n, 51), "action": torch.arange(n)})
    rb.update_priorities(torch.arange(n), torch.rand(n))
    nbytes = rb.save(tmp_path / "b.safetensors")
    row = rb.state_dict()["rows"].shape[1]
    # the filled rows, plus the trees' 8 bytes a slot of capacity (and a little for the header)
    assert nbytes < n * row + 9 * 100_000 + 100_000 and nbytes == (tmp_path / "b.safetensors").stat().st_size
    back = gper.PrioritizedReplayBuffer(100_000, spec, device="cpu", backend=backend, seed=0)
    back.add({"obs": torch.ones(2000, 51), "next_obs": torch.ones(2000, 51), "action": torch.ones(2000).long()})
    back.load(tmp_path / "b.safetensors")  # over a buffer holding more: the rows past the file's are cleared
    for (name, a), b in zip(rb.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, name
    assert torch.equal(rb.sample(64).indices, back.sample(64).indices)


def test_a_file_with_fewer_rows_than_filled_slots_is_refused(tmp_path):
    rb = used()
    rb.save(tmp_path / "b.safetensors")
    tensors = pytest.importorskip("safetensors.torch").load_file(tmp_path / "b.safetensors")
    with files.TensorFile(tmp_path / "b.safetensors") as f:
        meta = f.metadata
    files.write_tensors(tmp_path / "short.safetensors", tensors | {"rows": tensors["rows"][: len(rb) - 1]}, meta)
    other = used(n=5)
    before = snapshot(other)
    with pytest.raises(ValueError, match=f"holds the rows of {len(rb) - 1} slots, but {len(rb)} are filled"):
        other.load(tmp_path / "short.safetensors")
    assert_unchanged(other, before)


def test_save_streams_a_chunk_at_a_time(tmp_path, monkeypatch):
    """The host holds one chunk at a time: with 256-byte chunks, no write is larger."""
    monkeypatch.setattr(files, "CHUNK_BYTES", 256)
    rb = used(capacity=500, n=400)
    sizes = []
    real = files.atomic_file

    class Spy:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            sizes.append(len(b))
            return self.f.write(b)

    def spying(path):
        import contextlib

        @contextlib.contextmanager
        def cm():
            with real(path) as f:
                yield Spy(f)

        return cm()

    monkeypatch.setattr(files, "atomic_file", spying)
    rb.save(tmp_path / "b.safetensors")
    assert max(sizes[2:]) <= 256 and sum(sizes[2:]) >= rb.rows.nbytes
    monkeypatch.setattr(files, "atomic_file", real)
    fresh = make_buffer(500, arity=4)
    fresh.load(tmp_path / "b.safetensors")  # read back 256 bytes of rows at a time
    assert torch.equal(fresh.rows.rows, rb.rows.rows)


def test_a_save_that_fails_midway_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "b.safetensors"
    used(n=10).save(path)
    old = path.read_bytes()
    monkeypatch.setattr(files, "CHUNK_BYTES", 64)
    calls = {"n": 0}
    real_numpy = torch.Tensor.numpy

    def failing(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk full")
        return real_numpy(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "numpy", failing)
    with pytest.raises(OSError, match="disk full"):
        used(n=40).save(path)
    assert path.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["b.safetensors"]


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage header", "missing", "a torch.save file"])
def test_a_damaged_file_is_refused_and_changes_nothing(tmp_path, damage):
    path = tmp_path / "b.safetensors"
    used(n=40).save(path)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "garbage header":
        path.write_bytes(data[:8] + b"{not json" + data[17:])
    elif damage == "missing":
        path.unlink()
    else:
        torch.save({"rows": torch.zeros(3)}, path)
    target = used(n=12)
    before = snapshot(target)
    with pytest.raises(ValueError, match="b.safetensors"):
        target.load(path)
    assert_unchanged(target, before)


def test_a_file_of_other_settings_is_refused(tmp_path):
    path = tmp_path / "b.safetensors"
    used().save(path)
    other = make_buffer(50, arity=4, alpha=0.7)
    before = snapshot(other)
    with pytest.raises(ValueError, match="alpha"):
        other.load(path)
    assert_unchanged(other, before)


# ---------------------------------------------------------------------------- copies


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_continues_like_the_original(device, how):
    rb = used(device=device, sampling="stratified")
    twin = copy.deepcopy(rb) if how == "deepcopy" else pickle.loads(pickle.dumps(rb))
    assert twin is not rb and twin.device == rb.device and twin.backend == rb.backend and len(twin) == len(rb)
    assert twin.rows.rows.data_ptr() != rb.rows.rows.data_ptr()
    for _ in range(3):
        a, b = rb.sample(16), twin.sample(16)
        assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)
        rb.update_priorities(a, torch.arange(16.0, device=rb.device))
        twin.update_priorities(b, torch.arange(16.0, device=rb.device))
    assert rb.stats() == twin.stats()


def test_a_buffer_with_a_kernel_module_refuses_to_be_copied():
    from gper.ops.tree import reference

    rb = gper.PrioritizedReplayBuffer(8, {"x": ((), torch.float32)}, backend=reference)
    with pytest.raises(TypeError, match="kernel module"):
        copy.deepcopy(rb)


def test_a_state_of_the_filled_slots_only_loads_and_one_short_of_them_is_refused():
    rb = used()
    state = rb.state_dict()
    prefix = dict(state, rows=state["rows"][: len(rb)].clone(), gen=state["gen"][: len(rb)].clone())
    back = used(n=5)
    back.load_state_dict(prefix)
    assert_unchanged(back, snapshot(rb))
    short = dict(prefix, rows=prefix["rows"][:-1])
    before = snapshot(back)
    with pytest.raises(ValueError, match=f"holds the rows of {len(rb) - 1} slots, but {len(rb)} are filled"):
        back.load_state_dict(short)
    assert_unchanged(back, before)

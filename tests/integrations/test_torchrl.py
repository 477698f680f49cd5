"""gper.integrations.torchrl: TorchRL's TensorDict replay interface over gper's buffer, checked
against gper itself and inside a real TorchRL DQN loop (GymEnv, QValueActor, DQNLoss, Collector)."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys

import pytest
import torch

tensordict = pytest.importorskip("tensordict")
pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")

from tensordict import TensorDict  # noqa: E402

import gper  # noqa: E402
from gper.integrations.torchrl import PrioritizedReplayBuffer  # noqa: E402

ALPHA, BETA, EPS = 0.6, 0.4, 1e-8


def _rb(capacity=64, **kw) -> PrioritizedReplayBuffer:
    args = dict(alpha=ALPHA, beta=BETA, capacity=capacity, batch_size=16, device="cpu", backend="torch", seed=5)
    return PrioritizedReplayBuffer(**(args | kw))


def _data(n: int, start: int = 0) -> TensorDict:
    """n transitions whose every leaf encodes its item number (so a sample can be checked by value)."""
    i = torch.arange(start, start + n)
    return TensorDict(
        {
            "observation": i[:, None].float().expand(n, 4) + torch.arange(4) / 10,
            "action": torch.nn.functional.one_hot(i % 2, 2),
            "pixels": (i[:, None, None] % 251).to(torch.uint8).expand(n, 2, 3),
            "next": {
                "observation": i[:, None].float().expand(n, 4) + 1,
                "reward": i[:, None].float(),
                "done": (i % 3 == 0)[:, None],
            },
            ("collector", "traj_ids"): i,
        },
        batch_size=[n],
    )


def test_importing_without_tensordict_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensordict", None)  # `import tensordict` now raises ImportError
    monkeypatch.delitem(sys.modules, "gper.integrations.torchrl")
    with pytest.raises(ImportError, match=r'^gper.integrations.torchrl needs tensordict: pip install "\.\[torchrl\]"$'):
        importlib.import_module("gper.integrations.torchrl")


def test_the_package_imports_no_adapter():
    code = "import sys, gper.integrations; print(sorted({'tensordict', 'torchrl'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_nested_keys_round_trip_with_wrap_around():
    rb = _rb(capacity=7)
    first = rb.extend(_data(5))
    second = rb.extend(_data(5, start=5))  # 10 items in 7 slots: items 3..9 stay
    assert first.tolist() == [0, 1, 2, 3, 4] and second.tolist() == [5, 6, 0, 1, 2]
    assert rb.keys == [
        ("observation",),
        ("action",),
        ("pixels",),
        ("next", "observation"),
        ("next", "reward"),
        ("next", "done"),
        ("collector", "traj_ids"),
    ]
    s = rb.sample(200)
    assert s.batch_size == torch.Size([200]) and s.device == torch.device("cpu")
    item = s["collector", "traj_ids"]
    assert set(item.tolist()) == set(range(3, 10))
    assert (s["index"] == item % 7).all()  # item k went to slot k % 7
    expected = _data(10)[item]
    for key in rb.keys:
        assert s[key].dtype == expected[key].dtype and torch.equal(s[key], expected[key]), key


def test_index_and_weights_agree_with_gper_and_torchrl_formula():
    rb = _rb(capacity=100, seed=11)
    td = _data(40)
    rb.extend(td)
    ref = gper.PrioritizedReplayBuffer(
        100, rb.buffer.spec, alpha=ALPHA, beta=BETA, eps=EPS, device="cpu", backend="torch", seed=11
    )
    ref.add({".".join(k): td[k] for k in rb.keys})
    p = torch.rand(40) * 5
    rb.update_priority(torch.arange(40), p)
    ref.update_priorities(torch.arange(40), p)
    s, batch = rb.sample(64), ref.sample(64)
    assert torch.equal(s["index"], batch.indices)
    assert torch.equal(s["priority_weight"], batch.weights)
    # TorchRL's PrioritizedSampler: w_i = (p_i / p_min) ** -beta with p = (priority + eps) ** alpha
    stored = (p + EPS) ** ALPHA
    torch.testing.assert_close(s["priority_weight"], (stored[s["index"]] / stored.min()) ** -BETA, rtol=1e-5, atol=0)
    s, info = rb.sample(8, return_info=True)  # TorchRL's info: the same tensors as in the sample
    assert set(info) == {"index", "priority_weight", "index_generation"}
    assert all(info[k] is s.get(k) for k in info)
    rb.beta = 1.0  # annealed: the next sample's weights use it
    assert rb.beta == 1.0 and rb.buffer.beta == 1.0
    s = rb.sample(64)
    torch.testing.assert_close(s["priority_weight"], stored.min() / stored[s["index"]], rtol=1e-5, atol=0)


def test_update_tensordict_priority_moves_priorities_and_skips_stale_slots():
    rb = _rb(capacity=8)
    rb.extend(_data(8))
    s = rb.sample(6)
    s["td_error"] = torch.arange(1.0, 7.0)[:, None] * torch.tensor([1.0, 0.5])  # [B, 2]: reduced by max
    rb.update_tensordict_priority(s)
    last = {int(i): k for k, i in enumerate(s["index"])}  # duplicates: the last occurrence wins
    idx = torch.tensor(list(last))
    want = (torch.tensor([float(k + 1) for k in last.values()]) + EPS) ** ALPHA
    torch.testing.assert_close(rb.buffer.priorities(idx), want)

    s = rb.sample(8)
    overwritten = rb.extend(_data(3, start=8))  # slots 0, 1, 2 now hold new items
    before = rb.buffer.priorities(torch.arange(8))
    s["td_error"] = torch.full((8, 1), 100.0)
    rb.update_tensordict_priority(s.clone())  # a copy of the sample carries what the check needs
    after = rb.buffer.priorities(torch.arange(8))
    fresh = set(s["index"].tolist()) - set(overwritten.tolist())
    for slot in range(8):
        assert after[slot] == ((100.0 + EPS) ** ALPHA if slot in fresh else before[slot]), slot
    stale = sum(int(i) in overwritten.tolist() for i in s["index"])
    assert rb.buffer.stats()["stale_updates"] == stale > 0


def test_a_sample_from_before_a_load_or_another_buffer_updates_nothing():
    rb, other = _rb(), _rb()
    rb.extend(_data(10))
    other.extend(_data(10))
    state = rb.state_dict()
    s = rb.sample(5)
    s["td_error"] = torch.full((5,), 9.0)
    rb.load_state_dict(state)
    rb.sample(3), other.sample(3)  # both have drawn since: only the sample's own state tells it apart
    before = rb.buffer.priorities(torch.arange(10))
    rb.update_tensordict_priority(s)
    other.update_tensordict_priority(s)
    assert torch.equal(rb.buffer.priorities(torch.arange(10)), before)
    assert torch.equal(other.buffer.priorities(torch.arange(10)), torch.ones(10))
    assert rb.buffer.stats()["stale_updates"] == other.buffer.stats()["stale_updates"] == 5
    rb.update_priority(s["index"], s["td_error"])  # raw indices: no check, as in TorchRL
    torch.testing.assert_close(rb.buffer.priorities(s["index"]), torch.full((5,), (9.0 + EPS) ** ALPHA))


def test_extend_with_priorities_add_iter_empty_and_repr():
    rb = _rb(capacity=4, batch_size=3)
    td = _data(6)
    td["td_error"] = torch.arange(6.0)
    assert rb.extend(td).tolist() == [2, 3, 0, 1]  # the last 4 kept, at their own priorities
    torch.testing.assert_close(rb.buffer.priorities(torch.arange(4)), (torch.tensor([4.0, 5, 2, 3]) + EPS) ** ALPHA)
    assert "td_error" not in rb.sample().keys() and ("td_error",) not in rb.keys
    slot = rb.add(_data(1, start=6)[0])
    assert slot.dim() == 0 and int(slot) == 2 and len(rb) == 4
    batches = iter(rb)
    assert [next(batches).batch_size for _ in range(3)] == [torch.Size([3])] * 3
    assert "capacity=4, size=4, batch_size=3" in repr(rb) and "('next', 'observation')" in repr(rb)
    rb.empty()
    assert len(rb) == 0 and rb.keys is not None
    with pytest.raises(RuntimeError, match="empty; extend"):
        rb.sample()
    rb.extend(_data(2))
    assert len(rb) == 2
    unsized = _rb(batch_size=None)
    unsized.extend(_data(2))
    with pytest.raises(RuntimeError, match="no batch_size given"):
        unsized.sample()
    with pytest.raises(RuntimeError, match="cannot iterate"):
        next(iter(unsized))


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ({"observation": torch.zeros(3, 4)}, TypeError, "takes a TensorDict"),
        (TensorDict({"observation": torch.zeros(2, 3, 4)}, [2, 3]), ValueError, "one batch dim"),
        (
            _data(3).exclude(("next", "reward")),
            KeyError,
            r"missing keys \[\('next', 'reward'\)\], unexpected keys \[\]",
        ),
        (_data(3).set("extra", torch.zeros(3)), KeyError, r"missing keys \[\], unexpected keys \['extra'\]"),
        (
            _data(3).set("action", torch.zeros(3, 2)),
            ValueError,
            r"'action' is \(2,\) torch.float32 per item, expected \(2,\) torch.int64",
        ),
        (_data(3).set("observation", torch.zeros(3, 5)), ValueError, r"\(5,\).*expected \(4,\)"),
        (_data(3).set_non_tensor("note", "hi"), TypeError, "'note' holds NonTensorData; gper stores tensors only"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(bad, error, match):
    rb = _rb()
    rb.extend(_data(5))
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in rb.buffer.state_dict().items()}
    with pytest.raises(error, match=match):
        rb.extend(bad)
    assert len(rb) == 5 and rb.buffer.stats()["cursor"] == 5
    assert torch.equal(rb.buffer.state_dict()["rows"], state["rows"])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="alpha must be in"):
        _rb(alpha=1.5)
    with pytest.raises(ValueError, match="reduction must be one of"):
        _rb(reduction="sum")
    rb = _rb()
    with pytest.raises(ValueError, match="beta must be in"):
        rb.beta = -0.1
    assert rb.beta == BETA
    first = TensorDict({"z": torch.zeros(3, dtype=torch.complex64)}, [3])
    with pytest.raises(TypeError, match="dtype must be one of"):
        rb.extend(first)
    assert rb.keys is None and rb.buffer is None  # the first extend failed: nothing was fixed
    with pytest.raises(ValueError, match=r"keys 'a.b' and \('a', 'b'\) would both be field 'a.b'"):
        rb.extend(TensorDict({"a.b": torch.zeros(2), "a": {"b": torch.zeros(2)}}, [2]))
    rb.extend(_data(4))
    with pytest.raises(ValueError, match="3 priorities for 2 indices"):
        rb.update_priority(torch.tensor([0, 1]), torch.ones(3))
    with pytest.raises(TypeError, match="index must be integers"):
        rb.update_priority(torch.tensor([0.0]), 1.0)
    with pytest.raises(KeyError, match="no \\['td_error'\\]"):
        rb.update_tensordict_priority(rb.sample(2))


def test_state_dict_dumps_and_pickle_round_trip_and_sampling_repeats(tmp_path):
    rb = _rb(capacity=32)
    rb.extend(_data(20))
    rb.update_priority(torch.arange(20), torch.rand(20))
    rb.beta = 0.7
    rb.dumps(tmp_path / "rb")
    state = pickle.loads(pickle.dumps(rb.state_dict()))
    copy = pickle.loads(pickle.dumps(rb))
    want = rb.sample(50)
    from_file, from_state = _rb(capacity=32, seed=99), _rb(capacity=32, seed=99)  # built at the load
    from_file.loads(tmp_path / "rb")
    from_state.load_state_dict(state)
    for restored in (from_file, from_state, copy):
        got = restored.sample(50)
        assert restored.beta == 0.7 and restored.keys == rb.keys
        assert all(torch.equal(got[k], want[k]) for k in rb.keys + [("index",), ("priority_weight",)])


def test_a_refused_load_changes_nothing(tmp_path):
    rb = _rb(capacity=32)
    rb.extend(_data(6))
    other = _rb(capacity=32)
    other.extend(TensorDict({"x": torch.zeros(3)}, [3]))
    other.dumps(tmp_path / "other")
    with pytest.raises(ValueError, match="the state holds keys"):
        rb.loads(tmp_path / "other")
    with pytest.raises(ValueError, match="configuration differs in \\['capacity'"):
        rb.load_state_dict(_small_state())  # beta 0.9 is adopted only with the rest
    with pytest.raises(ValueError, match="missing or damaged"):
        rb.loads(tmp_path / "nothing")
    assert len(rb) == 6 and rb.beta == rb.buffer.beta == BETA and rb.keys == _rb_keys()


def _small_state():
    rb = _rb(capacity=16)
    rb.extend(_data(2))
    rb.beta = 0.9
    return rb.state_dict()


def _rb_keys():
    rb = _rb()
    rb.extend(_data(1))
    return rb.keys


# ---------------------------------------------------------------- a TorchRL DQN loop


def _dqn_loop(device: str, frames: int):
    """DQN on CartPole-v1 as TorchRL's examples build it (GymEnv, QValueActor over an MLP,
    epsilon-greedy, Collector, DQNLoss, SoftUpdate, Adam) with gper's buffer."""
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate

    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    spec = env.action_spec.to(device)  # the policy runs on `device`, the environment on the CPU
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[64, 64]), in_keys=["observation"], spec=spec)
    actor = actor.to(device)
    explore = EGreedyModule(spec, annealing_num_steps=frames, eps_init=1.0, eps_end=0.05).to(device)
    loss = DQNLoss(actor, action_space=spec, delay_value=True, double_dqn=True)
    loss.make_value_estimator(gamma=0.99)
    target = SoftUpdate(loss, eps=0.99)
    opt = torch.optim.Adam(loss.parameters(), lr=1e-3)
    rb = PrioritizedReplayBuffer(
        alpha=0.6,
        beta=0.4,
        capacity=10_000,
        batch_size=64,
        device=device,
        backend="torch" if device == "cpu" else "auto",
        seed=0,
    )
    collector = Collector(
        env,
        TensorDictSequential(actor, explore),
        frames_per_batch=100,
        total_frames=frames,
        policy_device=device,
        storing_device=device,
        env_device="cpu",
        auto_register_policy_transforms=False,
    )
    first = None
    for data in collector:
        rb.extend(data)
        explore.step(data.numel())
        if len(rb) < 500:
            continue
        for _ in range(4):
            sample = rb.sample()
            loss_value = loss(sample)["loss"]
            opt.zero_grad()
            loss_value.backward()
            opt.step()
            target.step()
            rb.update_tensordict_priority(sample)
            first = sample if first is None else first
    collector.shutdown()
    return rb, loss, first


@pytest.fixture(scope="module")
def trained():
    return _dqn_loop("cpu", 2000)


def test_a_torchrl_dqn_loop_moves_priorities(trained):
    rb, loss, first = trained
    stats = rb.buffer.stats()
    assert len(rb) == stats["size"] == 2000 and stats["stale_updates"] == 0
    assert rb.keys is not None and ("next", "observation") in rb.keys and ("next", "reward") in rb.keys
    # the first batch's slots no longer sit at the priority new items enter with
    p = rb.buffer.priorities(first["index"])
    assert (p != 1.0).all() and p.std() > 0
    # one more step: the slots take DQNLoss's td_error (its squared TD error) as TorchRL's sampler would
    sample = rb.sample(64)
    loss(sample)
    rb.update_tensordict_priority(sample)
    last = {int(i): k for k, i in enumerate(sample["index"])}  # duplicates: the last occurrence wins
    td_error = sample["td_error"][list(last.values()), 0]
    torch.testing.assert_close(rb.buffer.priorities(torch.tensor(list(last))), (td_error + EPS) ** ALPHA)


def test_dqn_loss_is_the_weighted_mean_of_its_per_sample_losses(trained):
    rb, loss, _ = trained
    sample = rb.sample(256)
    w = sample["priority_weight"]
    assert w.std() > 0.01 and w.max() <= 1.0
    weighted = loss(sample.clone())["loss"].detach()
    loss.use_prioritized_weights, loss.reduction = False, "none"
    try:
        per_sample = loss(sample.clone())["loss"].detach()
    finally:
        loss.use_prioritized_weights, loss.reduction = "auto", "mean"
    assert per_sample.shape == (256,)
    torch.testing.assert_close(weighted, (per_sample * w).sum() / w.sum())
    assert not torch.isclose(weighted, per_sample.mean(), rtol=1e-3)


def test_a_trained_buffer_round_trips_and_samples_the_same(trained, tmp_path):
    rb, _, _ = trained
    rb.dumps(tmp_path / "rb")
    want = rb.sample(128)
    restored = PrioritizedReplayBuffer(
        alpha=0.6, beta=0.4, capacity=10_000, batch_size=64, device="cpu", backend="torch", seed=123
    )
    restored.loads(tmp_path / "rb")
    got = restored.sample(128)
    assert torch.equal(got["index"], want["index"]) and torch.equal(got["priority_weight"], want["priority_weight"])
    assert all(torch.equal(got[k], want[k]) for k in rb.keys)


@pytest.mark.gpu
def test_the_dqn_loop_runs_on_cuda_with_the_buffer_there():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rb, _, first = _dqn_loop("cuda", 1500)
    assert rb.device.type == "cuda" and first.device.type == "cuda"
    assert first["priority_weight"].device.type == "cuda" and first["index"].device.type == "cuda"
    assert rb.buffer.stats()["size"] == 1500 and (rb.buffer.priorities(first["index"]) != 1.0).all()

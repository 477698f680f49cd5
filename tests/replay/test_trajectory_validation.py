"""TrajectoryReplayBuffer refuses bad input with a clear error and changes nothing.

Every case checks the exception type, that the message names the offending argument or field,
and that every tensor of ``state_dict()`` (rows, trees, generations, counters, RNG state, the
streams' counts, episode starts and pending observations) is bit for bit what it was. Tensors on
the "meta" device stand in for "another device" on a machine without a GPU. The types follow the
flat buffer's (tests/replay/test_validation.py): KeyError for missing or unexpected fields,
TypeError for a wrong type or dtype, ValueError for a wrong value or shape or device; where the
flat buffer itself mixes the two (an int setting given as a float, a spec entry of the wrong
shape), either is accepted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gper
from trajectory_helpers import SPEC, Run, assert_unchanged, snapshot, to_torch

META = torch.device("meta")
E, T, W = 2, 8, 3  # streams, rows per stream, window


def expect_error(rb, call, exc, *words):
    before = snapshot(rb)
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for word in words:
        assert word in msg, f"{exc.__name__} message {msg!r} does not mention {word!r}"
    assert "\n" not in msg.strip(), f"a one-line message, got {msg!r}"
    assert_unchanged(rb, before)


@pytest.fixture
def run():
    """A buffer with history: sampled, updated, its RNG counter advanced."""
    r = Run(E * T, E, W, seed=3)
    for _ in range(W + 3):
        r.add()
    batch, idx, gens = r.check_sample(4, 1, None)
    r.update_batch(batch, idx, gens)
    return r


def step(**changes) -> dict[str, torch.Tensor]:
    data = {
        "obs": torch.full((E, 3), 0.25),
        "action": torch.zeros(E, dtype=torch.int64),
        "reward": torch.ones(E),
        "next_obs": torch.full((E, 3), 0.5),
        "terminated": torch.zeros(E, dtype=torch.bool),
        "truncated": torch.zeros(E, dtype=torch.bool),
    }
    for k, v in changes.items():
        if v is None:
            del data[k]
        else:
            data[k] = v
    return data


ADD_CASES = {
    "not a mapping": ([torch.zeros(E, 3)], TypeError, ["mapping"]),
    "missing field": (step(action=None), KeyError, ["action"]),
    "missing reward": (step(reward=None), KeyError, ["reward"]),
    "missing next_obs": (step(next_obs=None), KeyError, ["next_obs"]),
    "missing terminated": (step(terminated=None), KeyError, ["terminated"]),
    "missing truncated": (step(truncated=None), KeyError, ["truncated"]),
    "extra field": (step(done=torch.zeros(E, dtype=torch.bool)), KeyError, ["done"]),
    "a discount": (step(discount=torch.ones(E)), KeyError, ["discount"]),
    "not a tensor": (step(action=[0, 0]), TypeError, ["action"]),
    "obs dtype": (step(obs=torch.zeros(E, 3, dtype=torch.float64)), TypeError, ["obs", "float64"]),
    "next_obs dtype": (step(next_obs=torch.zeros(E, 3, dtype=torch.float16)), TypeError, ["next_obs", "float16"]),
    "terminated dtype": (step(terminated=torch.zeros(E)), TypeError, ["terminated", "bool"]),
    "truncated dtype": (step(truncated=torch.zeros(E, dtype=torch.uint8)), TypeError, ["truncated", "bool"]),
    "action dtype": (step(action=torch.zeros(E, dtype=torch.int32)), TypeError, ["action", "int64"]),
    "more streams": (step(obs=torch.zeros(E + 1, 3)), ValueError, ["obs", str(E)]),
    "fewer streams": (step(reward=torch.ones(E - 1)), ValueError, ["reward", str(E)]),
    "flags of more streams": (step(terminated=torch.zeros(E + 1, dtype=torch.bool)), ValueError, ["terminated"]),
    "obs shape": (step(obs=torch.zeros(E, 4)), ValueError, ["obs", f"({E}, 4)", f"({E}, 3)"]),
    "next_obs shape": (step(next_obs=torch.zeros(E, 3, 1)), ValueError, ["next_obs"]),
    "no stream dim": (step(action=torch.tensor(0)), ValueError, ["action"]),
    "flag column": (step(truncated=torch.zeros(E, 1, dtype=torch.bool)), ValueError, ["truncated"]),
    "other device": (step(obs=torch.zeros(E, 3, device=META)), ValueError, ["obs", "meta"]),
    "next_obs other device": (step(next_obs=torch.zeros(E, 3, device=META)), ValueError, ["next_obs", "meta"]),
    "flags other device": (step(terminated=torch.zeros(E, dtype=torch.bool, device=META)), ValueError, ["meta"]),
}


@pytest.mark.parametrize("case", list(ADD_CASES))
def test_add_rejects(run, case):
    data, exc, words = ADD_CASES[case]
    expect_error(run.rb, lambda: run.rb.add(data), exc, *words)


SAMPLE_CASES = [
    ({"n_step": 0}, ValueError, ["n_step"]),
    ({"n_step": -1}, ValueError, ["n_step"]),
    ({"n_step": W + 1}, ValueError, ["n_step", str(W)]),
    ({"n_step": 2.0, "gamma": 0.9}, TypeError, ["n_step", "int"]),
    ({"n_step": True}, TypeError, ["n_step", "int"]),
    ({"n_step": torch.tensor(2), "gamma": 0.9}, TypeError, ["n_step"]),
    ({"n_step": 2}, ValueError, ["gamma"]),  # gamma=None: n_step=1 only
    ({"n_step": 2, "gamma": 1.5}, ValueError, ["gamma", "[0, 1]"]),
    ({"n_step": 2, "gamma": -0.01}, ValueError, ["gamma", "[0, 1]"]),
    ({"n_step": 2, "gamma": math.nan}, ValueError, ["gamma"]),
    ({"n_step": 2, "gamma": math.inf}, ValueError, ["gamma"]),
    ({"n_step": 2, "gamma": "0.9"}, TypeError, ["gamma"]),
    ({"n_step": 2, "gamma": torch.tensor([0.9])}, ValueError, ["gamma"]),
    ({"n_step": 2, "gamma": torch.tensor(1.5)}, ValueError, ["gamma", "[0, 1]"]),  # read at once on the CPU
    ({"n_step": 2, "gamma": torch.tensor(1)}, ValueError, ["gamma", "int64"]),
    ({"n_step": 2, "gamma": torch.tensor(0.9, device=META)}, ValueError, ["gamma", "meta"]),
    ({"beta": 1.5}, ValueError, ["beta"]),
]


@pytest.mark.parametrize("kw, exc, words", SAMPLE_CASES, ids=[str(c[0]) for c in SAMPLE_CASES])
def test_sample_rejects(run, kw, exc, words):
    expect_error(run.rb, lambda: run.rb.sample(4, **kw), exc, *words)


@pytest.mark.parametrize("b, exc", [(0, ValueError), (2.0, TypeError)])
def test_sample_rejects_batch_size(run, b, exc):
    expect_error(run.rb, lambda: run.rb.sample(b), exc, "batch_size")
    expect_error(run.rb, lambda: run.rb.sample_sequences(b, 2), exc, "batch_size")


SEQ_CASES = [
    ({"length": 0}, ValueError, ["length"]),
    ({"length": W + 1}, ValueError, ["length", str(W)]),
    ({"length": 2.0}, TypeError, ["length", "int"]),
    ({"length": 2, "burn_in": -1}, ValueError, ["burn_in"]),
    ({"length": 2, "burn_in": 1.0}, (TypeError, ValueError), ["burn_in", "int"]),
    ({"length": 2, "beta": -0.5}, ValueError, ["beta"]),
]


@pytest.mark.parametrize("kw, exc, words", SEQ_CASES, ids=[str(c[0]) for c in SEQ_CASES])
def test_sample_sequences_rejects(run, kw, exc, words):
    expect_error(run.rb, lambda: run.rb.sample_sequences(4, **kw), exc, *words)


def test_sample_needs_window_plus_one_adds():
    """Before ``window + 1`` adds no start need be drawable: sample raises, even where an episode
    of length 1 made one drawable already."""
    r = Run(E * T, E, W, seed=1)
    for _ in range(W + 1):
        for call in (lambda: r.rb.sample(4), lambda: r.rb.sample_sequences(4, 1)):
            expect_error(r.rb, call, RuntimeError, "add")
        r.add()
    r.check_sample(4, 1, None)
    r.check_sequences(4, 1, 0, zeros=False)
    # one stream that ends an episode every step: drawable starts after 2 adds, still refused
    rb = gper.TrajectoryReplayBuffer(E * T, E, SPEC, window=W, device="cpu")
    for n in range(2):
        o = np.full((E, 3), float(n), np.float32)
        flags = {"terminated": np.ones(E, bool), "truncated": np.zeros(E, bool)}
        rb.add(
            to_torch(
                {"obs": o, "next_obs": o + 10, "action": np.zeros(E, np.int64), "reward": np.ones(E, np.float32)}
                | flags
            )
        )
    assert bool(rb.drawable().any())
    expect_error(rb, lambda: rb.sample(4), RuntimeError, "add")


UPDATE_CASES = ["sample td [B, 2]", "sample td [B + 1]", "sequence td [B]", "sequence td [B, L + 1]", "raw td [B, 1]"]


@pytest.mark.parametrize("case", UPDATE_CASES)
def test_update_rejects_td_of_the_wrong_shape(run, case):
    rb = run.rb
    if case.startswith("sample"):
        src = rb.sample(4)
        td = torch.ones(4, 2) if "2]" in case else torch.ones(5)
    elif case.startswith("sequence"):
        src = rb.sample_sequences(4, 2, burn_in=1)
        td = torch.ones(4) if case.endswith("[B]") else torch.ones(4, 3)
    else:
        src, td = torch.tensor([0, 1, 2, 3]), torch.ones(4, 1)
    expect_error(rb, lambda: rb.update_priorities(src, td), ValueError, "td")


@pytest.mark.parametrize("eta", [-0.1, 1.5, math.nan])
def test_update_rejects_eta_outside_the_unit_interval(run, eta):
    seq = run.rb.sample_sequences(4, 2)
    expect_error(run.rb, lambda: run.rb.update_priorities(seq, torch.ones(4, 2), eta=eta), ValueError, "eta")


@pytest.mark.parametrize("idx", [[0, E * T], [-1, 0]])
def test_update_rejects_raw_indices_outside_the_buffer(run, idx):
    expect_error(run.rb, lambda: run.rb.update_priorities(torch.tensor(idx), torch.ones(2)), IndexError, "out of range")


def test_update_rejects_td_of_the_wrong_dtype_or_device(run):
    batch = run.rb.sample(4)
    expect_error(run.rb, lambda: run.rb.update_priorities(batch, torch.ones(4, dtype=torch.int64)), TypeError, "td")
    expect_error(run.rb, lambda: run.rb.update_priorities(batch, torch.ones(4, device=META)), ValueError, "meta")


CTOR_CASES = [
    ({"capacity": 17}, ValueError, ["num_envs", "17"]),
    ({"capacity": 2 * (W + 1)}, ValueError, ["window", str(W + 2)]),  # T = W + 1 rows per stream
    ({"num_envs": 0}, ValueError, ["num_envs"]),
    ({"num_envs": 2.0}, (TypeError, ValueError), ["num_envs", "int"]),
    ({"window": 0}, ValueError, ["window"]),
    ({"window": 2.5}, (TypeError, ValueError), ["window", "int"]),
    ({"spec": {"obs": ((3,), torch.float32)}}, ValueError, ["reward"]),
    ({"spec": {**SPEC, "reward": ((), torch.float64)}}, (TypeError, ValueError), ["reward", "float32"]),
    ({"spec": {**SPEC, "reward": ((2,), torch.float32)}}, (TypeError, ValueError), ["reward", "scalar"]),
    ({"spec": {"action": ((), torch.int64), "reward": ((), torch.float32)}}, ValueError, ["obs"]),
    ({"obs_keys": ("pixels",)}, ValueError, ["pixels"]),
    ({"obs_keys": ()}, (TypeError, ValueError), ["obs_keys"]),
    ({"sampling": "prioritized"}, ValueError, ["sampling"]),
    ({"alpha": 1.5}, ValueError, ["alpha"]),
] + [
    ({"spec": {**SPEC, name: ((), torch.float32)}}, ValueError, [name])
    for name in ("terminated", "truncated", "discount", "mask", "next_obs")
]


@pytest.mark.parametrize("kw, exc, words", CTOR_CASES, ids=[str(c[0]) for c in CTOR_CASES])
def test_constructor_rejects(kw, exc, words):
    args = {"capacity": E * T, "num_envs": E, "spec": SPEC, "window": W, "device": "cpu", **kw}
    with pytest.raises(exc) as info:
        gper.TrajectoryReplayBuffer(**args)
    for word in words:
        assert word in str(info.value), f"{info.value!r} does not mention {word!r}"


def test_the_smallest_ring_is_accepted():
    """T = window + 2 rows per stream is enough (a drawable start never reads a row being written)."""
    r = Run(E * (W + 2), E, W, seed=2)
    for step in range(3 * (W + 2)):
        r.add()
        r.check_state(f"add {step}")
        if step >= W:
            r.check_sample(8, W, 0.5, what=f"add {step}")
            r.check_sequences(8, W, 1, what=f"add {step}", zeros=False)

"""Hindsight relabelling's index kernels: the Triton ones (gper.ops.her.triton) against the torch
reference (gper.ops.her.reference) on the index states a buffer builds, bit for bit: the index
after every add, and the goal rows and relabel flags of every strategy and ratio (0, a half, 1)."""

from __future__ import annotations

import inspect

import pytest
import torch

import gper
from gper.ops.her import reference as her_reference
from gper.ops.her import triton as her_triton
from gper.ops.her.reference import STRATEGY
from helpers import TRITON_ON_CPU
from her_oracle import OBS_KEYS, SPEC, GoalStreams, reward_fn
from trajectory_helpers import to_torch

needs_interpreter = pytest.mark.skipif(not TRITON_ON_CPU, reason="needs triton under TRITON_INTERPRET=1")
E, T, W = 3, 12, 3
INDEX = ("episode_ids", "episode_current", "episode_records")


@pytest.mark.parametrize("name", ["episode_index_add", "her_pick", "her_finish"])
def test_both_modules_define_each_function_with_the_same_keyword_parameters(name):
    ref, tri = inspect.signature(getattr(her_reference, name)), inspect.signature(getattr(her_triton, name))
    assert list(ref.parameters) == list(tri.parameters)
    assert {p.kind for p in ref.parameters.values()} == {inspect.Parameter.KEYWORD_ONLY}


def _history(steps: int = 60) -> list[tuple[dict, dict]]:
    """(state before, state after) of every add of a torch-backend buffer (its index tensors and streams)."""
    her = gper.HindsightRelabeling(reward_fn, info_keys=("action",))
    kw = {"window": W, "obs_keys": OBS_KEYS, "device": "cpu", "backend": "torch", "her": her}
    rb = gper.TrajectoryReplayBuffer(E * T, E, SPEC, **kw)
    gen = GoalStreams(E, seed=2, long_length=2 * T, p_zero_step=0.5)
    out = []
    for _ in range(steps):
        before = {k: v.clone() for k, v in rb.state_dict().items() if k in INDEX + ("streams",)}
        rb.add(to_torch(gen.step()))
        after = {k: v.clone() for k, v in rb.state_dict().items() if k in INDEX + ("streams",)}
        out.append((before, after | {"drawable": rb.drawable().nonzero().squeeze(1)}))
    return out


@needs_interpreter
def test_triton_index_add_and_pick_match_the_reference():
    history = _history()
    for step, (before, after) in enumerate(history):
        ids, current, records = (before[k].clone() for k in INDEX)
        her_triton.episode_index_add(
            before=before["streams"],
            streams=after["streams"],
            ids=ids,
            current=current,
            records=records,
            rows_per_env=T,
        )
        for k, got in zip(INDEX, (ids, current, records), strict=True):
            assert torch.equal(got, after[k]), f"add {step}: {k}"
    _, state = history[-1]
    g = torch.Generator().manual_seed(0)
    idx = state["drawable"][torch.randint(0, state["drawable"].numel(), (300,), generator=g)]
    for strategy in STRATEGY.values():
        for threshold in (0, 2**31, 2**32):
            counter = torch.tensor([12345], dtype=torch.int64)
            outs = []
            for module in (her_reference, her_triton):
                goal, flag = torch.empty_like(idx), torch.empty(idx.shape, dtype=torch.bool)
                module.her_pick(
                    idx=idx,
                    streams=state["streams"],
                    ids=state["episode_ids"],
                    records=state["episode_records"],
                    counter=counter,
                    seed=0x1234_5678_9ABC,
                    strategy=strategy,
                    threshold=threshold,
                    rows_per_env=T,
                    out_goal=goal,
                    out_flag=flag,
                )
                outs.append((goal, flag))
            (g0, f0), (g1, f1) = outs
            assert torch.equal(g0, g1) and torch.equal(f0, f1), (strategy, threshold)
            relabelled = int(f0.sum())
            if threshold in (0, 2**32):  # never, always (every drawn start's range has a row)
                assert relabelled == (0 if threshold == 0 else idx.numel())
            else:
                assert 0 < relabelled < idx.numel()


@needs_interpreter
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("with_hit", [False, True])
@pytest.mark.parametrize("goal_at", [(16, 8), (12, 6)], ids=["whole words", "sharing a word"])
def test_triton_finish_matches_the_reference(n, with_hit, goal_at):
    """Random rows, flags and rewards (the semantics are the oracle's tests'): every output bit for bit."""
    g = torch.Generator().manual_seed(n + 2 * with_hit)
    e, t, w, b = 3, 8, 10, 64
    rows = torch.randint(-(2**31), 2**31 - 1, (e * t, w), generator=g, dtype=torch.int32)
    # flags words: a step's terminated / truncated now and then, end rows among them
    u = torch.rand(e * t, generator=g)
    rows[:, 2] = torch.where(u < 0.2, 0x1, 0) | torch.where((u > 0.1) & (u < 0.3), 0x100, 0)
    rows[:, 2] |= torch.where(torch.rand(e * t, generator=g) < 0.1, 0x10000, 0)
    offset, nbytes = goal_at
    inputs = {
        "rows": rows,
        "idx": torch.randint(0, e * t, (b,), generator=g),
        "flag": torch.rand(b, generator=g) < 0.7,
        "goal": torch.randint(0, 256, (b, nbytes), generator=g, dtype=torch.uint8),
        "reward": torch.randn(b, n, generator=g),
        "hit": (torch.rand(b, n, generator=g) < 0.3) if with_hit else None,
        "gamma": torch.tensor(0.9),
        "rows_per_env": t,
        "reward_col": 1,
        "flags_col": 2,
        "desired_offset": offset,
    }
    outs = {
        "out_rows": torch.randint(-(2**31), 2**31 - 1, (b, w), generator=g, dtype=torch.int32),
        "out_next": torch.randint(-(2**31), 2**31 - 1, (b, w), generator=g, dtype=torch.int32),
        "out_discount": torch.rand(b, generator=g),
    }
    got = []
    for module in (her_reference, her_triton):
        mine = {k: v.clone() for k, v in outs.items()}
        module.her_finish(**inputs, **mine)
        got.append(mine)
    for k in outs:
        assert torch.equal(got[0][k].view(torch.int32), got[1][k].view(torch.int32)), k
    assert not torch.equal(got[0]["out_rows"], outs["out_rows"])  # it wrote something

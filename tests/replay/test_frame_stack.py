"""Frame stacks of the trajectory buffer (``frame_stack=S``) against a plain-Python oracle.

Every frame says where it comes from (stream, episode, step in the episode), so a drawn
transition names its own start; the oracle keeps each stream's written rows in time order (an
episode's steps, then the end row of its final observation) and says which are still in the ring.
A stack must hold the episode's last ``S`` frames up to its anchor, the oldest first, and zeros for
frames before the episode's first or no longer stored.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gper
from gper.ops import kernels

SHAPE = (2, 4)  # a tiny "frame": 8 uint8
SPEC = {"obs": (SHAPE, torch.uint8), "action": ((), torch.int64), "reward": ((), torch.float32)}


def frame(e: int, ep: int, t: int) -> np.ndarray:
    """The frame of stream ``e``'s episode ``ep`` at step ``t`` (``t`` = the episode's length: its
    final observation); byte 7 is never 0, so no frame is all zeros."""
    return np.array([e, ep % 256, t % 256, ep // 256, t // 256, 9, 9, 1], dtype=np.uint8).reshape(SHAPE)


def decode(f: np.ndarray) -> tuple[int, int, int]:
    b = f.reshape(-1).astype(int)
    return b[0], b[1] + 256 * b[3], b[2] + 256 * b[4]


class StackOracle:
    """Each stream's rows in time order, ``("step", ep, t)`` or ``("end", ep, length)`` (an end row
    is written by the add after the episode's last step, which shows how the episode goes on)."""

    def __init__(self, num_envs: int, rows_per_env: int) -> None:
        self.rows = [[] for _ in range(num_envs)]
        self.t = rows_per_env

    def stored(self, e: int, ep: int, t: int) -> bool:
        return ("step", ep, t) in self.rows[e][-self.t :]

    def stack(self, e: int, ep: int, anchor: int, first_stored: int, s: int) -> np.ndarray:
        """The stack of ``s`` frames ending at step ``anchor`` of episode ``ep``: the frames of steps
        below ``first_stored`` (the start) must still be stored, those from it on always are."""
        out = np.zeros((s, *SHAPE), np.uint8)
        for j in range(s):
            t = anchor - (s - 1 - j)
            if t >= first_stored or (t >= 0 and self.stored(e, ep, t)):
                out[j] = frame(e, ep, t)
        return out


def steps(num_envs: int, oracle: StackOracle, n: int, p_end: float, seed: int, autoreset: str):
    """``n`` steps (``add``'s dicts) of ``num_envs`` streams whose episodes end with probability
    ``p_end`` (terminated or truncated), in ``autoreset``'s convention; the oracle records the rows."""
    rng = np.random.default_rng(seed)
    ep, t, final, end_row = [0] * num_envs, [0] * num_envs, [None] * num_envs, [None] * num_envs
    for _ in range(n):
        obs, nxt, term, trunc = [], [], [], []
        for e in range(num_envs):
            if end_row[e] is not None:  # written by the add after the episode's last step
                oracle.rows[e].append(end_row[e])
                end_row[e] = None
            if final[e] is not None:  # a next-step reset step: the final obs, then the new episode's first
                obs.append(final[e])
                nxt.append(frame(e, ep[e], 0))
                term.append(False)
                trunc.append(False)
                final[e] = None
                continue
            ended = rng.random() < p_end
            kind = rng.integers(2)
            obs.append(frame(e, ep[e], t[e]))
            nxt.append(frame(e, ep[e], t[e] + 1))
            term.append(bool(ended and kind == 0))
            trunc.append(bool(ended and kind == 1))
            oracle.rows[e].append(("step", ep[e], t[e]))
            t[e] += 1
            if ended:
                end_row[e] = ("end", ep[e], t[e])
                if autoreset == "next-step":
                    final[e] = frame(e, ep[e], t[e])
                ep[e], t[e] = ep[e] + 1, 0
        yield {
            "obs": torch.from_numpy(np.stack(obs)),
            "next_obs": torch.from_numpy(np.stack(nxt)),
            "action": torch.zeros(num_envs, dtype=torch.int64),
            "reward": torch.ones(num_envs),
            "terminated": torch.tensor(term),
            "truncated": torch.tensor(trunc),
        }


def feed(buf, oracle: StackOracle, n: int, p_end: float, seed: int, autoreset: str) -> None:
    for step in steps(buf.num_envs, oracle, n, p_end, seed, autoreset):
        buf.add(step)


def check_batch(batch, oracle: StackOracle, s: int, n_step: int) -> None:
    obs, nxt = batch["obs"].cpu().numpy(), batch["next_obs"].cpu().numpy()
    assert obs.shape == (batch.batch_size, s, *SHAPE) and obs.dtype == np.uint8
    for i in range(batch.batch_size):
        e, ep, t = decode(obs[i, -1])
        e2, ep2, t2 = decode(nxt[i, -1])
        assert (e2, ep2) == (e, ep) and 1 <= t2 - t <= n_step, (i, (e, ep, t), (e2, ep2, t2))
        np.testing.assert_array_equal(obs[i], oracle.stack(e, ep, t, t, s), err_msg=f"obs stack of draw {i}")
        np.testing.assert_array_equal(nxt[i], oracle.stack(e, ep, t2, t, s), err_msg=f"next_obs stack of draw {i}")


@pytest.mark.parametrize("autoreset", ["same-step", "next-step"])
@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("rows_per_env", [9, 64])  # 9: the ring wraps many times and overwrites frames of a stack
def test_stacks_hold_the_episodes_last_frames(device, backend, autoreset, n_step, rows_per_env):
    """On CUDA the draws replay from the buffer's CUDA graphs (the second draw on is a replay)."""
    e_n, s = 3, 4
    buf = gper.TrajectoryReplayBuffer(
        e_n * rows_per_env, e_n, SPEC, window=3, frame_stack=s, backend=backend, autoreset=autoreset, seed=5,
        device=device, cuda_graphs=device.type == "cuda",
    )  # fmt: skip
    oracle = StackOracle(e_n, rows_per_env)
    feed(buf, oracle, 50, 0.2, seed=rows_per_env + n_step, autoreset=autoreset)
    for _ in range(2 if device.type == "cpu" else 4):
        check_batch(buf.sample(96, n_step=n_step, gamma=0.9), oracle, s, n_step)


def test_both_back_ends_stack_the_same_frames():
    if not gper._triton.HAS_TRITON:  # noqa: SLF001
        pytest.skip("needs triton")
    from helpers import TRITON_ON_CPU

    if not TRITON_ON_CPU:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    got = {}
    for backend in ("torch", "triton"):
        buf = gper.TrajectoryReplayBuffer(40, 2, SPEC, window=2, frame_stack=3, backend=backend, seed=1)
        feed(buf, StackOracle(2, 20), 50, 0.15, seed=2, autoreset="same-step")
        b = buf.sample(64, n_step=2, gamma=0.5)
        got[backend] = (b.indices, b["obs"], b["next_obs"], b["discount"])
    for x, y in zip(got["torch"], got["triton"], strict=True):
        assert torch.equal(x, y)


def test_stack_of_one_is_the_plain_buffer():
    """frame_stack=1 (the default) draws what it always did: one observation a draw."""
    a = gper.TrajectoryReplayBuffer(40, 2, SPEC, window=2, seed=3)
    feed(a, StackOracle(2, 20), 30, 0.2, seed=4, autoreset="same-step")
    b = a.sample(16, n_step=2, gamma=0.9)
    assert b["obs"].shape == (16, *SHAPE) and b.obs_stack is None


def test_the_kernels_agree_on_starts_of_every_stream_position():
    """Every drawable start of a wrapped ring, through both kernel modules directly."""
    buf = gper.TrajectoryReplayBuffer(30, 3, SPEC, window=2, frame_stack=4, seed=0)
    feed(buf, StackOracle(3, 10), 40, 0.25, seed=9, autoreset="same-step")
    idx = buf.drawable().nonzero().squeeze(1)
    col0, f = buf.layout.stack_span()
    outs = {}
    for name in ("torch", "triton"):
        from helpers import TRITON_ON_CPU

        if name == "triton" and not (gper._triton.HAS_TRITON and TRITON_ON_CPU):  # noqa: SLF001
            continue
        o = torch.full((2, idx.numel(), 4, f), -7, dtype=torch.int32)
        kernels("trajectory", name).stack_frames(
            rows=buf.rows.words,
            streams=buf.streams,
            rows_per_env=10,
            n_step=2,
            flags_col=buf.layout.flags_col,
            col0=col0,
            idx=idx,
            out_obs=o[0],
            out_next=o[1],
        )
        assert (o != -7).all()
        outs[name] = o
    if len(outs) == 2:
        assert torch.equal(outs["torch"], outs["triton"])


def test_bad_frame_stacks_are_refused():
    with pytest.raises(ValueError, match="frame_stack must be an int >= 1"):
        gper.TrajectoryReplayBuffer(40, 2, SPEC, window=2, frame_stack=0)
    with pytest.raises(ValueError, match="frame_stack must be an int >= 1"):
        gper.TrajectoryReplayBuffer(40, 2, SPEC, window=2, frame_stack=True)
    odd = {"obs": ((3,), torch.uint8), "action": ((), torch.int64), "reward": ((), torch.float32)}
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        gper.TrajectoryReplayBuffer(40, 2, odd, window=2, frame_stack=4)
    gper.TrajectoryReplayBuffer(40, 2, odd, window=2)  # without stacks any field is fine
    wide = {"obs": ((3,), torch.float64), "action": ((), torch.int64), "reward": ((), torch.float32)}
    with pytest.raises(ValueError, match="elements of up to 4 bytes"):
        gper.TrajectoryReplayBuffer(40, 2, wide, window=2, frame_stack=2)


def test_a_stacked_buffer_round_trips_its_settings():
    buf = gper.TrajectoryReplayBuffer(40, 2, SPEC, window=2, frame_stack=4, seed=0)
    assert "frame_stack=4" in repr(buf)
    feed(buf, StackOracle(2, 20), 12, 0.2, seed=1, autoreset="same-step")
    import copy

    twin = copy.deepcopy(buf)
    assert twin.frame_stack == 4
    assert torch.equal(twin.sample(8, n_step=1)["obs"], buf.sample(8, n_step=1)["obs"])


def test_instances_stack_each_instances_own_frames():
    buf = gper.TrajectoryReplayBuffer(40, 2, SPEC, window=2, frame_stack=4, instances=3, seed=2)
    oracles = [StackOracle(2, 20) for _ in range(3)]
    each = [steps(2, oracles[i], 30, 0.2, seed=10 + i, autoreset="same-step") for i in range(3)]
    for parts in zip(*each, strict=True):
        buf.add({k: torch.stack([p[k] for p in parts]) for k in parts[0]})
    b = buf.sample(16, n_step=2, gamma=0.9)
    assert b["obs"].shape == (3, 16, 4, *SHAPE) and b["next_obs"].shape == (3, 16, 4, *SHAPE)
    for i in range(3):
        obs, nxt = b["obs"][i].numpy(), b["next_obs"][i].numpy()
        for j in range(16):
            e, ep, t = decode(obs[j, -1])
            _, _, t2 = decode(nxt[j, -1])
            np.testing.assert_array_equal(obs[j], oracles[i].stack(e, ep, t, t, 4))
            np.testing.assert_array_equal(nxt[j], oracles[i].stack(e, ep, t2, t, 4))


@pytest.mark.gpu
def test_stacks_past_two_to_the_31_words_on_cuda():
    """A buffer whose rows hold more than 2^31 int32 words (1.3M transitions of 84 x 84 frames): the
    Triton draw and stacks address them in 64 bits, and agree with the torch reference."""
    e, rows_per_env = 10, 131_072
    spec = {"obs": ((84, 84), torch.uint8), "action": ((), torch.int64), "reward": ((), torch.float32)}
    buf = gper.TrajectoryReplayBuffer(e * rows_per_env, e, spec, window=3, frame_stack=4, device="cuda", seed=0)
    assert buf.capacity * buf.layout.words > 2**31
    g = torch.Generator(device="cuda").manual_seed(0)
    obs = torch.randint(0, 256, (e, 84, 84), dtype=torch.uint8, device="cuda", generator=g)
    for _ in range(rows_per_env + 50):
        nxt = torch.randint(0, 256, (e, 84, 84), dtype=torch.uint8, device="cuda", generator=g)
        ended = torch.rand(e, device="cuda", generator=g) < 0.01
        buf.add({"obs": obs, "action": torch.zeros(e, dtype=torch.int64, device="cuda"),
                 "reward": torch.ones(e, device="cuda"), "next_obs": nxt, "terminated": ended,
                 "truncated": torch.zeros_like(ended)})  # fmt: skip
        obs = torch.where(ended[:, None, None], torch.randint_like(nxt, 0, 256, generator=g), nxt)
    b = buf.sample(4096, n_step=3, gamma=0.99)
    assert int(b.indices.max()) * buf.layout.words > 2**31  # draws from the far end of the rows
    assert torch.equal(b.rows[:, : 84 * 84 // 4], buf.rows.words[b.indices, : 84 * 84 // 4])
    col0, f = buf.layout.stack_span()
    want = torch.empty(2, 4096, 4, f, dtype=torch.int32, device="cuda")
    kernels("trajectory", "torch").stack_frames(
        rows=buf.rows.words, streams=buf.streams, rows_per_env=rows_per_env, n_step=3,
        flags_col=buf.layout.flags_col, col0=col0, idx=b.indices, out_obs=want[0], out_next=want[1],
    )  # fmt: skip
    assert torch.equal(b.obs_stack, want[0]) and torch.equal(b.next_stack, want[1])
    assert (b["obs"][:, -1] == buf.layout.row.view(b.rows, "obs")).all()


def test_wide_rows_take_fewer_draws_a_program_and_draw_the_same():
    """Rows as wide as a frame run fewer draws a sampling program (``sample_block``); what is drawn
    does not change with it."""
    from helpers import TRITON_ON_CPU

    if not (gper._triton.HAS_TRITON and TRITON_ON_CPU):  # noqa: SLF001
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    from gper.ops.tree.triton import launch_config, sample_block

    assert sample_block(56) == 16 and sample_block(512) == 16 and sample_block(1768) == 4
    assert sample_block(14_122) == 1 and sample_block(10**6) == 1
    draws = []
    for block in (16, 2, 1):
        buf = gper.TrajectoryReplayBuffer(40, 2, SPEC, window=2, frame_stack=4, backend="triton", seed=3)
        feed(buf, StackOracle(2, 20), 30, 0.1, seed=0, autoreset="same-step")
        with launch_config(sample_block=block):
            b = buf.sample(37, n_step=2, gamma=0.9)
        draws.append((b.indices, b.rows, b.weights, b["obs"], b["next_obs"]))
    for other in draws[1:]:
        assert all(torch.equal(x, y) for x, y in zip(draws[0], other, strict=True))

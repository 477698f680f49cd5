"""One step of :meth:`gper.training.episodes.EpisodeTracker.record` as one Triton kernel.

As torch ops, recording a step takes about fifteen launches (the running sums, the cumulative sum
of the done flags for the ring positions, the stacked rows, the scatter, the count, the resets
of the sums), each bound by its launch on the GPU. Here one program walks the environments in
blocks, in order, carrying the ring position from block to block, and writes what the ops write:
the running returns and lengths, each finished episode's row at the same ring position, and the
count. It leaves the ring's spare row alone (the ops park the unfinished environments' rows there,
in no defined order).
"""

from __future__ import annotations

import torch

from gper._triton import HAS_TRITON, tl, triton

#: environments a block of the program handles: a population of 256 agents of 10 environments in
#: one block (the blocks run one after the other, each a cumulative sum)
BLOCK = 4096
#: warps of the program: a block of 4096 is 16 environments a thread
NUM_WARPS = 8

if HAS_TRITON:

    @triton.jit
    def _record_kernel(
        reward_ptr,  # [n] float32 or float64 rewards of this step
        done_ptr,  # [n] bool: the episode ended in this step
        returns_ptr, lengths_ptr,  # [n] float64 running sums, updated
        resetting_ptr,  # [n] bool: this step is a reset step (next-step autoreset), updated
        table_ptr,  # [ring + 1, COLS] float64 ring of finished episodes
        count_ptr,  # int64 episodes recorded so far, advanced
        env_step_ptr,  # float64 env step at this step
        n, ring, per_agent,
        COLS: tl.constexpr, NEXT_STEP: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        count = tl.load(count_ptr)
        env_step = tl.load(env_step_ptr)
        for start in range(0, n, BLOCK):
            i = start + tl.arange(0, BLOCK)
            m = i < n
            reward = tl.load(reward_ptr + i, mask=m, other=0.0).to(tl.float64)
            done = tl.load(done_ptr + i, mask=m, other=0) != 0
            lengths = tl.load(lengths_ptr + i, mask=m, other=0.0)
            if NEXT_STEP:  # a reset step adds nothing to the episode it starts, and ends none
                live = tl.load(resetting_ptr + i, mask=m, other=0) == 0
                reward = tl.where(live, reward, 0.0)
                done = done & live
                tl.store(resetting_ptr + i, done, mask=m)
                lengths += live.to(tl.float64)
            else:
                lengths += 1.0
            returns = tl.load(returns_ptr + i, mask=m, other=0.0) + reward
            ended = (done & m).to(tl.int32)  # a block's count fits: the scan in 32 bits, the ring's in 64
            slot = (count + tl.cumsum(ended, axis=0).to(tl.int64) - 1) % ring
            row = table_ptr + slot * COLS
            tl.store(row, returns, mask=ended != 0)
            tl.store(row + 1, lengths, mask=ended != 0)
            tl.store(row + 2, tl.zeros_like(returns) + env_step, mask=ended != 0)
            if COLS == 4:  # a population's table: each environment's agent
                tl.store(row + 3, (i // per_agent).to(tl.float64), mask=ended != 0)
            count += tl.sum(ended, axis=0).to(tl.int64)
            keep = (~done).to(tl.float64)
            tl.store(returns_ptr + i, returns * keep, mask=m)
            tl.store(lengths_ptr + i, lengths * keep, mask=m)
        tl.store(count_ptr, count)


def record_step(
    reward: torch.Tensor,
    done: torch.Tensor,
    env_step: torch.Tensor,
    returns: torch.Tensor,
    lengths: torch.Tensor,
    resetting: torch.Tensor,
    table: torch.Tensor,
    count: torch.Tensor,
    *,
    per_agent: int,
    next_step: bool,
) -> None:
    """The tracker's record of one step in one launch (see the module docstring); the tracker's
    tensors are updated in place. ``per_agent``: environments an agent of a population has."""
    if not HAS_TRITON:
        raise RuntimeError("record_step needs Triton (pip install triton)")
    n = returns.shape[0]
    reward, done = reward.contiguous(), done.contiguous()  # read flat: a strided view is copied first
    _record_kernel[(1,)](
        reward, done, returns, lengths, resetting, table, count, env_step, n, table.shape[0] - 1, per_agent,
        COLS=table.shape[1], NEXT_STEP=next_step, BLOCK=min(BLOCK, triton.next_power_of_2(n)),
        num_warps=NUM_WARPS if n > 1024 else 4,
    )  # fmt: skip

"""``graph_iterations``: blocks of K collection iterations (with their training steps and target
updates) as one CUDA graph. On the CPU a block runs its phases in order, so a run with blocks is
bit for bit the run without (this checks the block schedule: which iterations train, which
training steps update the target, epoch ends, timed iterations, stop signals); on CUDA the
``gpu`` test checks the graphed run against the one without blocks."""

from __future__ import annotations

import pytest
import torch

from gper.dqn import Config, train
from gper.dqn.build import setup
from gper.training.iteration_graphs import MAX_GRAPHS, IterationGraphs, unsupported
from helpers import computed_records, run_checkpoint

#: hard target updates every 3 training steps, one training step every 2 iterations, epochs of
#: 25 iterations: blocks of 4 meet every kind of schedule and an epoch end inside a block's reach
SMALL = dict(
    env="cartpole", device="cpu", seed=3, total_steps=1600, num_envs=4, learning_starts=64, batch_size=16,
    buffer_size=1000, epoch_steps=100, hidden=(16,), train_every=2, tau=1.0, target_every=3, progress=False,
    checkpoint_every=0,
)  # fmt: skip


def _run(tmp_path, name: str, **changes):
    cfg = Config(**{**SMALL, **changes}, run_dir=str(tmp_path), run_name=name)
    res = train(cfg, log=lambda *a: None)
    return res, run_checkpoint(tmp_path / name)[0], computed_records(tmp_path / name)


def _same_tensors(a, b, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        if path.endswith("/episodes/table"):
            # the episode ring's last row is its trash row: every step's unfinished episodes are
            # written there together (index_copy_ of duplicate indices), so on CUDA any of them may land
            a, b = a[:-1], b[:-1]
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same_tensors(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_tensors(x, y, f"{path}/{i}")
    else:
        assert a == b, path


@pytest.mark.parametrize("k, time_every, population", [(4, 0, 1), (7, 10, 1), (2, 3, 2)])
def test_blocks_train_as_iteration_by_iteration_on_the_cpu(tmp_path, k, time_every, population):
    one, one_state, one_records = _run(tmp_path, "one", time_every=time_every, population=population)
    blk, blk_state, blk_records = _run(
        tmp_path, "blocks", graph_iterations=k, time_every=time_every, population=population
    )
    assert (blk.env_steps, blk.train_steps, blk.episodes) == (one.env_steps, one.train_steps, one.episodes)
    assert blk_records == one_records
    _same_tensors(blk_state["agent"], one_state["agent"])  # networks, optimizer, counters, sums


def test_the_schedule_of_a_block():
    cfg, agent, _ = setup(Config(**SMALL), log=lambda *a: None)
    blocks = IterationGraphs(agent, 4)
    assert blocks.ready()  # on the CPU at once
    # training steps 5, 6 after it: 6 updates the target (every 3)
    want = ((True, False), (False, False), (True, True), (False, False))
    assert blocks.schedule([True, False, True, False], 4) == want
    soft = setup(Config(**{**SMALL, "tau": 0.01}), log=lambda *a: None)[1]
    assert IterationGraphs(soft, 2).schedule([True, True], 2) == ((True, False), (True, False))
    assert MAX_GRAPHS >= 1


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="graph_iterations must be an integer >= 1"):
        train(Config(**{**SMALL, "graph_iterations": 0}, run_dir=str(tmp_path)), log=lambda *a: None)
    # every window of 10 iterations would hold a timed one: no block could run
    with pytest.raises(ValueError, match="graph_iterations 10 needs time_every 0 or above 10, got time_every 10"):
        train(Config(**{**SMALL, "graph_iterations": 10, "time_every": 10}, run_dir=str(tmp_path)), log=lambda *a: None)
    assert not any(tmp_path.iterdir())  # refused before a run folder was made

    class NoPhases:
        device = "cpu"

    assert "no collect step" in unsupported(NoPhases())
    with pytest.raises(ValueError, match="graph_iterations: the learner has no collect step"):
        IterationGraphs(NoPhases(), 4)


@pytest.mark.gpu
@pytest.mark.parametrize("population", [1, 3])
def test_on_cuda_blocks_replay_one_graph_per_schedule(tmp_path, population):
    cuda = dict(device="cuda", time_every=0, total_steps=2400, population=population)
    one, one_state, one_records = _run(tmp_path, "one", **cuda)
    blk, blk_state, blk_records = _run(tmp_path, "blocks", **cuda, graph_iterations=6)
    assert (blk.env_steps, blk.train_steps, blk.episodes) == (one.env_steps, one.train_steps, one.episodes)
    # the same kernels in the same order, the generator's draws at the same offsets: the same run
    assert blk_records == one_records
    _same_tensors(blk_state["agent"], one_state["agent"])

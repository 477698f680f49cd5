"""What each spawned rank runs in tests/distributed/test_sharded_edges.py (importable by the
spawned processes): edge cases of ShardedPrioritizedReplayBuffer found in review."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from gper.distributed import ShardedPrioritizedReplayBuffer

SPEC = {"who": ((2,), torch.int64)}
PER_RANK = 16


def build(world: int, **kw) -> ShardedPrioritizedReplayBuffer:
    """8 items on every rank, ``who = (rank, slot)``."""
    args = dict(alpha=1.0, beta=0.5, eps=1e-6, backend="torch", device="cpu", seed=7) | kw
    rb = ShardedPrioritizedReplayBuffer(PER_RANK * world, SPEC, **args)
    rank = dist.get_rank()
    rb.add({"who": torch.stack([torch.full((8,), rank), torch.arange(8)], 1)})
    return rb


class HostData(TorchFunctionMode):
    """Records every tensor made from host data (``torch.tensor``/``torch.as_tensor`` of a Python
    value): on a GPU each is a host-to-device copy, which a CUDA graph capture refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, object]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor):
            self.made.append((func.__name__, args[0]))
        return func(*args, **(kwargs or {}))


def no_host_data_in_a_step(rank: int, world: int) -> None:
    for mode in ("exact", "local"):
        for norm in ("global", "batch"):
            rb = build(world, mode=mode, weight_norm=norm)
            rb.sample(4)  # the first draw checks for items (a documented host read)
            with HostData() as seen:
                batch = rb.sample(4)
                rb.update_priorities(batch, torch.ones(4))
            assert seen.made == [], (mode, norm, seen.made)


def _copy(state: dict) -> dict:
    shard = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state["shard"].items()}
    return {"shard": shard, "distributed": dict(state["distributed"]), "shared_rng": state["shared_rng"].clone()}


def a_shard_refused_on_one_rank_loads_nowhere(rank: int, world: int, folder: str) -> None:
    """A state (or file) whose group part is right but whose shard the shard's own checks refuse,
    on the last rank only: every rank refuses, and every rank keeps its state (no rank loads)."""
    rb = build(world)
    path = f"{folder}/rank{rank}.safetensors"
    saved, group = _copy(rb.state_dict()), rb.save(path)
    for _ in range(3):
        rb.sample(4)
    before = _copy(rb.state_dict())
    bad = rank == world - 1
    state = _copy(saved)
    if bad:  # a damaged shard: a filled slot of generation 0
        state["shard"]["gen"] = torch.zeros_like(state["shard"]["gen"])
        torch.save({"not": "a buffer file"}, path)
    for load in (lambda: rb.load_state_dict(state), lambda: rb.load(path, group)):
        try:
            load()
            raise AssertionError("a state refused on one rank was loaded")
        except ValueError:
            pass
        now = rb.state_dict()
        assert torch.equal(now["shared_rng"], before["shared_rng"]), (rank, now["shared_rng"], before["shared_rng"])
        assert all(torch.equal(now["shard"][k], v) for k, v in before["shard"].items() if isinstance(v, torch.Tensor))
    batch = rb.sample(4)  # the group still draws as one: every row is its owner's
    assert torch.equal(batch["who"], torch.stack([batch.owners, batch.indices], 1))


def new_items_enter_at_the_group_max_after_an_update(rank: int, world: int) -> None:
    """Exact mode: after an update that raises the max priority on one shard, an item added on any
    shard before the next draw enters at the group's max priority, as in one buffer."""
    rb = build(world)
    batch = rb.sample(8)
    td = torch.ones(8)
    if rank == 0:
        td[0] = 1000.0  # every rank's batch holds draws of its own and others' shards: one large priority
    rb.update_priorities(batch, td)
    rb.add({"who": torch.full((1, 2), -1)})  # slot 8 of every shard
    mine = rb.shard.tree.leaves()[8].reshape(1).clone()
    every = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(every, mine)
    want = float(torch.tensor(1000.0 + 1e-6))  # (|td| + eps) ** alpha, alpha 1, in float32
    assert all(float(x) == want for x in every), every


def a_shard_that_fails_on_one_rank_fails_the_build_on_all(rank: int, world: int) -> None:
    """A shard that cannot be built on one rank (here: a bad spec there) makes every rank raise,
    none left waiting in the settings' all-gather: that rank its own error, the others one naming it."""
    spec = SPEC if rank != world - 1 else {"who": ((2,), "not a dtype")}
    try:
        ShardedPrioritizedReplayBuffer(PER_RANK * world, spec, backend="torch", device="cpu", seed=7)
    except RuntimeError as err:
        assert rank != world - 1 and f"rank {world - 1} could not be built" in str(err), (rank, err)
    except (TypeError, ValueError) as err:
        assert rank == world - 1, (rank, err)
    else:
        raise AssertionError(f"rank {rank} built a buffer whose shard failed on rank {world - 1}")
    # the group still works: every rank builds the next buffer alike
    assert len(ShardedPrioritizedReplayBuffer(PER_RANK * world, SPEC, backend="torch", device="cpu", seed=7)) == 0


#: |td| + eps of these is a power of two in float32 (eps = 2^-126 is lost next to 1): the trees'
#: sums are exact in any order and exp2(log2 p) = p, so shards of either back end hold the same bits
DYADIC_TD = (0.0, 1.0, 2.0, 4.0, 8.0)


def triton_shards_draw_as_torch_shards(rank: int, world: int) -> None:
    """Exact mode on shards that run Triton (under the interpreter) draws, routes and updates as
    on shards that run torch, bit for bit, in every sampling mode: owners, slots, rows,
    generations, weights, then the priorities and stale counts after the updates (one batch
    overwritten before its update); and a Triton step makes no tensor from host data."""
    n = 5 + 6 * rank  # unequal shards
    for sampling in ("proportional", "stratified", "uniform"):
        bufs = {}
        for backend in ("torch", "triton"):
            kw = dict(alpha=1.0, beta=0.5, eps=2.0**-126, sampling=sampling, backend=backend, device="cpu", seed=7)
            rb = ShardedPrioritizedReplayBuffer(PER_RANK * world, SPEC, **kw)
            rb.add({"who": torch.stack([torch.full((n,), rank), torch.arange(n)], 1)})
            rb.shard.update_priorities(torch.arange(n), torch.tensor([DYADIC_TD[(rank + 3 * j) % 5] for j in range(n)]))
            bufs[backend] = rb
        host = HostData()
        for step in range(3):
            got = {"torch": bufs["torch"].sample(8)}
            with host:  # (the torch back end's CPU kernels make host tensors: they never run on a GPU)
                got["triton"] = bufs["triton"].sample(8)
            a, b = got["torch"], got["triton"]
            for name in ("owners", "indices", "generations", "weights"):
                assert torch.equal(getattr(a, name), getattr(b, name)), (sampling, step, name)
            assert torch.equal(a["who"], b["who"]), (sampling, step)
            if step < 2:  # (then every shard's rows are overwritten)
                assert torch.equal(a["who"], torch.stack([a.owners, a.indices], 1)), (sampling, step)
            if step == 1:  # every slot of this shard overwritten: its entries of the batch are stale
                for rb in bufs.values():
                    rb.add({"who": torch.full((PER_RANK, 2), -1)})
            pick = (a.owners * 7 + a.indices * 3 + step) % 5
            td = torch.tensor(DYADIC_TD)[pick]
            bufs["torch"].update_priorities(got["torch"], td)
            with host:
                bufs["triton"].update_priorities(got["triton"], td)
        ta, tb = bufs["torch"].shard.tree, bufs["triton"].shard.tree
        assert torch.equal(ta.leaves(), tb.leaves()) and torch.equal(ta.max_priority(), tb.max_priority()), sampling
        sa, sb = bufs["torch"].stats(), bufs["triton"].stats()
        assert sa["stale_updates"] == sb["stale_updates"] > 0, (sampling, sa["stale_updates"], sb["stale_updates"])
        assert not host.made, host.made

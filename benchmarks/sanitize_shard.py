"""A target for ``compute-sanitizer`` on a sharded buffer's kernels (``gper.ops.shard.triton``) on
the GPU, each at sizes of many programs and checked against the torch reference: the shared draws
(whose last program, elected by an atomic ticket, advances the counter), the routed rows of three
ranks, the update entries and their unpack (one atomic per program on the stale counter), the
gathered meta and local mode's ratio and weights. With ``--buffer``, also a
``ShardedPrioritizedReplayBuffer`` over NCCL at world size 1, exact and local mode, stepped eagerly.

    compute-sanitizer --tool memcheck python benchmarks/sanitize_shard.py
    compute-sanitizer --tool racecheck python benchmarks/sanitize_shard.py
    compute-sanitizer --tool synccheck python benchmarks/sanitize_shard.py
    compute-sanitizer --tool memcheck python benchmarks/sanitize_shard.py --buffer

racecheck sees shared memory only; races between programs through global memory are what
``tests/ops/test_shard_kernels.py``'s GPU stress tests repeat.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch

from gper.ops.shard import reference as ref
from gper.ops.shard import triton as tri
from gper.ops.state import TreeState
from gper.ops.tree import reference as tree_reference
from gper.replay.tree import PriorityTree


def _state(gen: torch.Tensor, counters: torch.Tensor) -> TreeState:
    """A shard's tree state with these generations and counters (what ``unpack_updates`` reads)."""
    return PriorityTree(gen.numel(), tree_reference, gen.device).state._replace(gen=gen, counters=counters)


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    ints = {1: torch.uint8, 4: torch.int32, 8: torch.int64}[got.element_size()]
    if not torch.equal(got.contiguous().view(ints), want.contiguous().view(ints)):
        raise SystemExit(f"{what}: the Triton kernel differs from the reference")


def kernels() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w, n = 5, 3 * 16384 + 7
    meta = torch.zeros(w, 4, dtype=torch.float64, device=dev)
    meta[:, 0] = torch.rand(w, dtype=torch.float64, device=dev, generator=g) * 1e3
    meta[2, 0] = 0.0
    mass = meta[:, 0]
    cum = mass.cumsum(0)
    for stratified in (False, True):
        out = []
        for mod in (ref, tri):
            counter = torch.tensor([2**32 - 100], dtype=torch.int64, device=dev)
            ticket = torch.zeros(1, dtype=torch.int64, device=dev)
            for _ in range(3):
                draws = mod.shared_draws(
                    cum=cum, mass=mass, counter=counter, ticket=ticket, key=7, n=n, stratified=stratified, rank=1
                )
            out.append((draws, counter))
        (d0, c0), (d1, c1) = out
        same(c1, c0, "counter")
        for a, e in zip(d1, d0, strict=True):
            if e is not None:
                same(a, e, f"shared draws (stratified={stratified})")

    world, b, words = 3, 4096, 16
    owner = torch.randint(0, world, (world * b,), device=dev, generator=g)
    sent = []
    for k in range(world):
        kw = dict(
            rows=torch.randint(-(2**31), 2**31 - 1, (world * b, words), device=dev, dtype=torch.int32, generator=g),
            indices=torch.randint(0, 1000, (world * b,), device=dev, generator=g),
            generations=torch.randint(0, 2**31 - 1, (world * b,), device=dev, dtype=torch.int32, generator=g),
            leaves=torch.rand(1000, device=dev, generator=g),
            owner=owner,
            rank=k,
            world=world,
        )
        want = ref.pack_rows(**kw)
        same(tri.pack_rows(**kw), want, "packed rows")
        sent.append(want)
    total = torch.stack(sent).sum(0, dtype=torch.int32)
    for r in range(world):
        kw = dict(recv=total[r], owner=owner, rank=r, world=world)
        for a, e in zip(tri.unpack_rows(**kw), ref.unpack_rows(**kw), strict=True):
            same(a, e, "unpacked rows")

    packs = []
    for k in range(world):
        kw = dict(
            owners=torch.randint(0, world, (b,), device=dev, generator=g),
            indices=torch.randint(0, 1000, (b,), device=dev, generator=g),
            generations=torch.randint(0, 2**31 - 1, (b,), device=dev, dtype=torch.int32, generator=g),
            td=torch.randn(b, device=dev, generator=g),
            stale=k == 1,
        )
        want = ref.pack_updates(**kw)
        same(tri.pack_updates(**kw), want, "update entries")
        packs.append(want)
    every = torch.cat(packs)
    gen = torch.randint(0, 2**31 - 1, (1000,), device=dev, dtype=torch.int32, generator=g)
    for r in range(world):
        c0, c1 = (torch.zeros(8, dtype=torch.int64, device=dev) for _ in range(2))
        for a, e in zip(
            tri.unpack_updates(state=_state(gen, c1), every=every, rank=r),
            ref.unpack_updates(state=_state(gen, c0), every=every, rank=r),
            strict=True,
        ):
            same(a, e, "unpacked updates")
        same(c1, c0, "stale counter")

    mintop = torch.rand(32, device=dev, generator=g)
    kw = dict(total=cum[-1], mintop=mintop, size=torch.tensor(5, device=dev), maxp=mintop[3])
    same(tri.shard_meta(**kw), ref.shard_meta(**kw), "meta")
    leaves = torch.rand(1000, device=dev, generator=g)
    idx = torch.randint(0, 1000, (b,), device=dev, generator=g)
    for uniform in (False, True):
        kw = dict(cum=cum, mass=mass, leaves=leaves, indices=idx, rank=1, uniform=uniform)
        got, want = tri.local_priorities(**kw), ref.local_priorities(**kw)
        for a, e in zip(got, want, strict=True):
            same(a, e, "local priorities")
        weights = torch.rand(b, device=dev, generator=g)
        same(tri.local_weights(ratio=want[0], weights=weights), ref.local_weights(ratio=want[0], weights=weights), "w")


def buffer() -> None:
    import torch.distributed as dist

    from gper.distributed import ShardedPrioritizedReplayBuffer

    dist.init_process_group(
        "nccl",
        init_method="tcp://127.0.0.1:29517",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=120),
        device_id=torch.device("cuda", 0),
    )
    try:
        spec = {"obs": ((51,), torch.float32), "action": ((), torch.int64)}
        g = torch.Generator(device="cuda").manual_seed(1)
        for mode in ("exact", "local"):
            for sampling in ("proportional", "stratified"):
                rb = ShardedPrioritizedReplayBuffer(
                    1 << 14, spec, mode=mode, sampling=sampling, device="cuda", seed=2, cuda_graphs=False
                )
                assert rb.backend == "triton", rb.backend
                for _ in range(3):
                    rb.add(
                        {
                            "obs": torch.randn(7000, 51, device="cuda", generator=g),
                            "action": torch.randint(0, 45, (7000,), device="cuda", generator=g),
                        }
                    )
                    batch = rb.sample(4096)
                    rb.update_priorities(batch, torch.randn(4096, device="cuda", generator=g))
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--buffer", action="store_true", help="also step a sharded buffer over NCCL at world size 1")
    args = p.parse_args()
    kernels()
    if args.buffer:
        buffer()
    torch.cuda.synchronize()
    print("sanitize script done")


if __name__ == "__main__":
    main()

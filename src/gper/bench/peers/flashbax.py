"""flashbax as a peer: its prioritised flat buffer timed on the reference workload, its sum tree's
sampler, and the worker process both run in.

Timing: ``flashbax`` and ``flashbax-x64``, ``make_prioritised_flat_buffer`` on JAX's device,
its add / sample / set_priorities jitted (the state donated, so it is updated in place), in
float32 and with ``jax_enable_x64``. Each op is called as one jitted function (``jit``); the
step and step+add also as separate jitted calls (``jit-split``), and the step as a jitted
``lax.scan`` of :data:`SCAN_STEPS` steps (``jit-scan``: JAX's counterpart of a CUDA graph,
its time divided by the steps). Exactness: the same two variants, on flashbax's sum tree
directly (``set_batch_bincount`` to set, ``stratified_sample`` to draw: what its buffers call).

Each variant, and the trajectory buffer of :mod:`gper.bench.peers.flashbax_traj` (``flashbax-traj``),
runs in a worker process of its own (``python -m gper.bench.peers.flashbax``),
because x64 is a process-wide switch and because JAX keeps the memory it took until its process
ends; :func:`time_in_worker` and :func:`check_in_worker` start it and read back its results.
JAX and flashbax are imported only there (``pip install ".[peers]"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np
import torch

import gper
from gper.bench.checks import ExactConfig, run_checks
from gper.bench.harness import Group, Probed, Row, Sweep, fill, first_line, make_log
from gper.bench.peers import flashbax_traj
from gper.bench.peers.base import OPS, ExactSampler, Peer, Setting, Skip, flashbax_status, require, version
from gper.bench.peers.jax_peer import SCAN_STEPS, JaxPeer
from gper.bench.workload import (
    ALPHA,
    BETA,
    EPS,
    FILL_CHUNK,
    TrajectoryWorkload,
    format_capacity,
    jax_td_errors,
)

NAMES = ("flashbax", "flashbax-x64")
#: every variant the worker process times (the flat buffer's two, and the trajectory buffer)
WORKER_NAMES = NAMES + flashbax_traj.NAMES
WORKER_MODULE = "gper.bench.peers.flashbax"
WHERE_TIME_GOES = {
    "flashbax": "sample: a vmapped descent per sample (fori_loop, a lax.cond per level) and a gather of two items per "
    "sample; set_priorities and add: on GPU set_batch_bincount, whose bincount spans the whole capacity (O(N) a "
    "call), then level-by-level scatter-adds of deltas; on CPU set_batch_scan, one point update after another. "
    "A single jitted step that samples and updates makes XLA copy the tree (O(N)); separate calls (jit-split) don't. "
    "Each call also pays JAX's host-side dispatch; jit-scan (64 steps in one jitted lax.scan) shows the device time.",
    "flashbax-x64": "as flashbax with a float64 tree and probabilities (its stratified draws stay float32).",
}


#: installed (checked without importing JAX: it runs in a worker process)
status = flashbax_status


def jax_versions(x64: bool) -> str:
    import jax

    dev = jax.devices()[0]
    return (
        f"flashbax {version('flashbax')}, jax {jax.__version__} on {jax.default_backend()} "
        f"({getattr(dev, 'device_kind', dev.platform)}){', x64' if x64 else ''}"
    )


# ----------------------------------------------------------------------------------------------
# timing


class FlashbaxPeer(JaxPeer):
    """flashbax's prioritised flat buffer, every call jitted, the state donated to add and set_priorities.

    The buffer is a [A, N / A] trajectory layout (A = ``add_batch_size``): an add of B transitions
    is one call adding [A, B / A] sequences, which is how flashbax takes batches. Sampling returns
    pairs (t, t+1); only the first is used, so XLA may drop the second gather (favouring flashbax).
    flashbax returns probabilities, not weights: the weights are ``(N P_i) ** -beta`` divided by
    the batch's largest, as in flashbax's own PER example (no O(N) pass; favours flashbax).
    ``set_priorities`` stores ``p ** alpha``, so it is given ``|td| + eps``.
    """

    modes = ("jit",)

    def __init__(self, capacity: int, setting: Setting, x64: bool) -> None:
        self.capacity, self.device, self.x64 = capacity, setting.device, x64
        require("jax", "flashbax")
        import jax
        import jax.numpy as jnp
        from flashbax import make_prioritised_flat_buffer

        batches = list(setting.batches)
        self.jax, self.jnp = jax, jnp
        self.impls = ("flashbax-x64",) if x64 else ("flashbax",)
        self.backend = "gpu" if self.device.type == "cuda" else "cpu"
        self.add_batch = math.gcd(*batches, 256)
        while self.add_batch > 1 and capacity // self.add_batch < 4:
            self.add_batch //= 2
        a = self.add_batch
        self.make = lambda sample_batch: make_prioritised_flat_buffer(
            max_length=capacity,
            min_length=a,
            sample_batch_size=sample_batch,
            add_sequences=True,
            add_batch_size=a,
            priority_exponent=ALPHA,
            device=self.backend,
        )
        self.int_dtype = jnp.int64 if x64 else jnp.int32  # JAX has no int64 without x64
        example = {
            "obs": jnp.zeros(51, jnp.float32),
            "action": jnp.zeros((), self.int_dtype),
            "reward": jnp.zeros((), jnp.float32),
            "next_obs": jnp.zeros(51, jnp.float32),
            "done": jnp.zeros((), bool),
        }
        buffer = self.make(min(batches))
        self.key = jax.random.PRNGKey(setting.seed)
        self.gen_data = jax.jit(self._random_transitions, static_argnums=1)
        self.gen_td = jax.jit(partial(jax_td_errors, jax), static_argnums=1)
        self.state = buffer.init(example)
        add = jax.jit(buffer.add, donate_argnums=0)
        per_add = min(FILL_CHUNK, capacity) // a

        def add_chunk(lo: int, hi: int) -> None:
            self.state = add(self.state, self.gen_data(self._next_key(), per_add))
            jax.block_until_ready(self.state)

        fill(capacity, add_chunk, setting.fill_limit_s(), f"filling flashbax's buffer to {capacity:,} slots")
        self.set_all = jax.jit(buffer.set_priorities, donate_argnums=0)
        self.randomize_priorities()

    def _random_transitions(self, key, t: int) -> dict:
        jax, jnp, a = self.jax, self.jnp, self.add_batch
        k = jax.random.split(key, 5)
        return {
            "obs": jax.random.normal(k[0], (a, t, 51), jnp.float32),
            "action": jax.random.randint(k[1], (a, t), 0, 18, self.int_dtype),
            "reward": jax.random.normal(k[2], (a, t), jnp.float32),
            "next_obs": jax.random.normal(k[3], (a, t, 51), jnp.float32),
            "done": jax.random.uniform(k[4], (a, t)) < 0.05,
        }

    def randomize_priorities(self) -> None:
        self._set_random_priorities()
        self.jax.block_until_ready(self.state)

    def prepare(self, b: int, first: bool) -> None:
        super().prepare(b, first)
        jax, jnp, cap = self.jax, self.jnp, self.capacity
        self.new = self.gen_data(self._next_key(), b // self.add_batch) if b % self.add_batch == 0 else None
        buffer = self.make(b)

        def sample(state, key):
            key, sub = jax.random.split(key)
            s = buffer.sample(state, sub)
            w = (s.probabilities * cap) ** -BETA
            return key, s.experience.first, w / jnp.max(w), s.indices

        def update(state, index, td):
            return buffer.set_priorities(state, index, jnp.abs(td) + EPS)

        def step(state, key, td):
            key, batch, weights, index = sample(state, key)
            return update(state, index, td), key, batch, weights

        def step_add(state, key, new, td):
            return step(buffer.add(state, new), key, td)

        def steps(state, key, td):
            # SCAN_STEPS PER steps in one compiled loop; a checksum of every sampled field keeps XLA
            # from dropping the gathers of a batch nobody reads
            def body(carry, _):
                state, key, acc = carry
                state, key, batch, weights = step(state, key, td)
                leaves = jax.tree_util.tree_leaves(batch)
                total = weights.sum() + sum(jnp.sum(x.astype(jnp.float32)) for x in leaves)
                acc = acc + total.astype(jnp.float32)  # float64 under x64: the carry keeps its type
                return (state, key, acc), None

            (state, key, acc), _ = jax.lax.scan(body, (state, key, jnp.float32(0)), None, length=SCAN_STEPS)
            return state, key, acc

        self.f_sample = jax.jit(sample)
        self.f_steps = jax.jit(steps, donate_argnums=0)
        self.f_update = jax.jit(update, donate_argnums=0)
        self.f_step = jax.jit(step, donate_argnums=0)
        self.f_add = jax.jit(buffer.add, donate_argnums=0)
        self.f_step_add = jax.jit(step_add, donate_argnums=0)

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        td, new = self.td, self.new
        if name in ("add", "step+add") and new is None:
            raise Skip(f"an add of {b} must be [{self.add_batch}, {b}/{self.add_batch}] sequences")

        def sample():
            self.key, batch, weights, index = self.f_sample(self.state, self.key)
            return batch, weights

        def update():
            self.state = self.f_update(self.state, index, td)
            return self.state

        def step():
            self.state, self.key, batch, weights = self.f_step(self.state, self.key, td)
            return self.state, batch, weights

        def add():
            self.state = self.f_add(self.state, new)
            return self.state

        def step_add():
            self.state, self.key, batch, weights = self.f_step_add(self.state, self.key, new, td)
            return self.state, batch, weights

        def step_scan():
            self.state, self.key, acc = self.f_steps(self.state, self.key, td)
            return self.state, acc

        def step_split():
            self.key, batch, weights, drawn = self.f_sample(self.state, self.key)
            self.state = self.f_update(self.state, drawn, td)
            return self.state, batch, weights

        def step_add_split():
            add()
            return step_split()  # not add's state: step_split donated it

        if name == "update":
            index = self.f_sample(self.state, self.key)[3]
        if mode == "jit-split":
            return {"step": step_split, "step+add": step_add_split}[name]
        if mode == "jit-scan":
            return step_scan
        return {"sample": sample, "update": update, "step": step, "add": add, "step+add": step_add}[name]

    def modes_of(self, op: str) -> tuple[str, ...]:
        # one jitted function, as in a jitted training step; and separate jitted calls, which spare XLA the
        # copy of the tree that it makes when one function both reads it (sample) and updates it in place
        # and the step as a compiled loop (jit-scan), as a training loop written in JAX would run it
        return (
            ("jit", "jit-split", "jit-scan") if op == "step" else ("jit", "jit-split") if op == "step+add" else ("jit",)
        )


def build(impls: tuple[str, ...], capacity: int, setting: Setting) -> Peer:
    """In the worker process only (JAX's x64 switch is process-wide): see :func:`time_in_worker`."""
    if impls == flashbax_traj.NAMES:
        return flashbax_traj.build(impls, capacity, setting)
    return FlashbaxPeer(capacity, setting, x64=impls == ("flashbax-x64",))


def ops_of(impl: str) -> tuple[str, ...]:
    """The ops of variant ``impl``: the flat workload's, or the trajectory workload's for ``flashbax-traj``."""
    return flashbax_traj.ops_of(impl) if impl in flashbax_traj.NAMES else OPS


def ops_at(impl: str, b: int, setting: Setting) -> tuple[str, ...]:
    return flashbax_traj.ops_at(impl, b, setting) if impl in flashbax_traj.NAMES else OPS


# ----------------------------------------------------------------------------------------------
# exactness


class FlashbaxSampler(ExactSampler):
    """flashbax's sum tree: what its prioritised buffers set (on GPU) and draw from, counts kept in JAX."""

    kind = "stratified"

    def __init__(self) -> None:
        require("jax", "flashbax")
        import jax
        import jax.numpy as jnp
        from flashbax.buffers import sum_tree

        self.jax, self.jnp, self.st = jax, jnp, sum_tree
        self.key = jax.random.PRNGKey(1)
        self.set = jax.jit(sum_tree.set_batch_bincount)
        self.add = jax.jit(lambda counts, idx: counts.at[idx].add(1), donate_argnums=0)
        self.sample = jax.jit(sum_tree.stratified_sample, static_argnums=1)

    def load(self, prios: np.ndarray) -> None:
        jnp, n = self.jnp, len(prios)
        self.tree = self.st.init(n)
        for lo in range(0, n, 1 << 22):
            hi = min(lo + (1 << 22), n)
            self.tree = self.set(self.tree, jnp.arange(lo, hi), jnp.asarray(prios[lo:hi], dtype=jnp.float32))

    def draw(self, k: int):
        self.key, sub = self.jax.random.split(self.key)
        return self.sample(self.tree, k, sub)

    def new_counts(self, n: int):
        return self.jnp.zeros(n, dtype=self.jnp.int32)

    def add_counts(self, counts, idx):
        return self.add(counts, idx)

    def finish(self, counts) -> np.ndarray:
        return np.asarray(counts, dtype=np.int64)


def sampler(name: str, device: torch.device) -> FlashbaxSampler:
    """In the worker process only: see :func:`check_in_worker`."""
    return FlashbaxSampler()


# ----------------------------------------------------------------------------------------------
# the worker process: the parent's side


def _spawn(task: str, name: str, payload: dict, device: torch.device, timeout: float | None) -> tuple[dict | None, str]:
    """Run the worker on ``payload``; (what it wrote, or None; "" or why it did not finish)."""
    with tempfile.TemporaryDirectory() as tmp:
        config, out = Path(tmp) / "config.json", Path(tmp) / "out.json"
        config.write_text(json.dumps(payload))
        cmd = [sys.executable, "-m", WORKER_MODULE, task, name, "--config", str(config), "--out", str(out)]
        env = dict(os.environ)
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU to torch as well
        if device.type != "cuda":
            env["JAX_PLATFORMS"] = "cpu"
        # the worker imports the gper that this process runs
        here = str(Path(gper.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
        why = ""
        try:
            proc = subprocess.run(cmd, env=env, timeout=timeout)
            if proc.returncode:
                why = f"exited with status {proc.returncode}"
        except subprocess.TimeoutExpired:
            why = f"ran past its time limit ({timeout:.0f} s)"
        done = json.loads(out.read_text()) if out.exists() else None
    return done, why


def time_in_worker(
    name: str,
    device: torch.device,
    capacities: list[int],
    batches: list[int],
    ops: list[str],
    timer: Probed,
    seed: int,
    max_fill_s: float,
    left_s: float | None,
    timeout: float,
    traj: TrajectoryWorkload | None = None,
) -> tuple[list[dict], str, str]:
    """Time flashbax variant ``name`` over every capacity in a worker: (rows as dicts, versions, why it stopped).

    ``left_s``: seconds to the sweep's deadline (None: no deadline); the worker starts no build
    or cell after it. ``traj``: the trajectory workload (``flashbax-traj`` only).
    """
    payload = dict(
        device=device.type,
        capacities=capacities,
        batches=batches,
        ops=ops,
        timer=asdict(timer),
        seed=seed,
        max_fill_s=max_fill_s,
        deadline_s=left_s,
        threads=torch.get_num_threads(),
        traj=asdict(traj or TrajectoryWorkload()),
    )
    done, why = _spawn("peers", name, payload, device, timeout)
    done = done or {"rows": [], "versions": ""}
    return done["rows"], done.get("versions", ""), why


def check_in_worker(name: str, payload: dict, device: torch.device, timeout: float | None):
    """Run the exactness checks on flashbax variant ``name`` in a worker: (results as dicts or None, versions, why)."""
    done, why = _spawn("exactness", name, payload, device, timeout)
    if done is None:
        return None, "", why
    return done["results"], done["versions"], why


# ----------------------------------------------------------------------------------------------
# the worker process: its side


def _time(name: str, payload: dict, deadline: float | None, out: Path, log: Callable[[str], None]) -> int:
    import jax

    x64 = name == "flashbax-x64"
    device = torch.device(payload["device"])
    caps, batches, ops = payload["capacities"], payload["batches"], payload["ops"]
    want = "gpu" if device.type == "cuda" else "cpu"
    done = {"rows": [], "versions": ""}
    traj = TrajectoryWorkload(**payload.get("traj", {}))
    setting = Setting(device, payload["seed"], tuple(batches), payload["max_fill_s"], deadline, traj=traj)
    try:
        if jax.default_backend() != want:
            raise RuntimeError(f"JAX runs on {jax.default_backend()}, not {want}")
        done["versions"] = jax_versions(x64)
    except Exception as e:
        note = f"{type(e).__name__}: {first_line(e)}"
        cells = [(c, b, op) for c in caps for b in batches if b <= c for op in ops if op in ops_at(name, b, setting)]
        done["rows"] = [asdict(Row(name, op, c, b, "jit", status="error", note=note)) for c, b, op in cells]
        out.write_text(json.dumps(done))
        log(f"{name}: {note}")
        return 0
    sweep = Sweep(device, Probed(**payload["timer"]), ops, batches, deadline=deadline, log=log)
    for cap in caps:
        log(f"{name} at capacity {format_capacity(cap)} ({cap:,})")
        group = Group(
            cap,
            (name,),
            partial(build, (name,), cap, setting),
            ops_of=ops_of,
            ops_at=lambda impl, b: ops_at(impl, b, setting),
            unbuilt_modes=lambda impl: ("jit",),
        )
        done["rows"] += [asdict(r) for r in sweep.group(group)]
        out.write_text(json.dumps(done))
        jax.clear_caches()
    return 0


def _check(name: str, payload: dict, deadline: float | None, out: Path, log: Callable[[str], None]) -> int:
    x64 = name == "flashbax-x64"
    cfg = ExactConfig.from_payload(payload, name, deadline)
    results = run_checks(cfg, name, FlashbaxSampler(), log)
    out.write_text(json.dumps({"results": [asdict(r) for r in results], "versions": jax_versions(x64)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The worker: ``python -m gper.bench.peers.flashbax {peers,exactness} NAME --config C --out O``."""
    p = argparse.ArgumentParser(prog=f"python -m {WORKER_MODULE}", description="flashbax worker of gper bench")
    p.add_argument("task", choices=("peers", "exactness"))
    p.add_argument("name", choices=WORKER_NAMES)
    p.add_argument("--config", type=Path, required=True, help="the settings, as JSON")
    p.add_argument("--out", type=Path, required=True, help="where the results go, as JSON")
    args = p.parse_args(argv)
    payload = json.loads(args.config.read_text())
    left = payload.pop("deadline_s")
    deadline = None if left is None else time.monotonic() + left
    if payload.get("threads"):
        torch.set_num_threads(payload["threads"])
    import jax

    if args.name == "flashbax-x64":
        jax.config.update("jax_enable_x64", True)
    log = make_log(f"gper bench {args.task}: {args.name} worker")
    return (_time if args.task == "peers" else _check)(args.name, payload, deadline, args.out, log)


if __name__ == "__main__":
    sys.exit(main())

"""flashbax's prioritised trajectory buffer as a peer, timed on the trajectory workload (in the flashbax worker).

``flashbax-traj``: ``make_prioritised_trajectory_buffer`` with ``add_batch_size = num_envs``,
``period = 1`` and ``max_length_time_axis = capacity // num_envs``: ``num_envs`` rows of steps in
time order, one priority per step, as gper's trajectory buffer keeps them. A step stores its
observation once (obs, action, reward, terminated, truncated; the action as int32, since JAX has
no int64 without x64). An n-step transition is a sampled sequence of ``n + 1`` steps
(``sample_sequence_length = n + 1``), turned into the n-step return, the observation ``m <= n``
steps ahead (``m``: up to the first end of an episode), terminated / truncated and the discount
in the same jitted function as the sample, so the work matches ``rb.sample(B, n_step=n, gamma)``.
flashbax keeps no final observation of an episode (the row after an end holds the next
episode's first), so its ``next_obs`` there is that first observation: a truncated episode's
bootstrap is wrong, and the data read is less than gper's (favours flashbax).

The adds keep the validity of 4-step sequences, and the 1-step sample reads 2-step sequences
from the same state (every start valid for 4 steps is valid for 2). Weights are
``(N P_i) ** -beta`` over the batch's largest, as for the flat ``flashbax`` peer. Ops: ``sample-n1``,
``sample-n3``, ``step-n1``, ``step-n3`` (sample, then ``set_priorities`` of what it drew: one jitted
function, separate jitted calls, and a jitted ``lax.scan`` of :data:`SCAN_STEPS` steps), and
``add-envs`` (one step of every stream, ``[num_envs, 1]``). JAX and flashbax are imported in the
worker process only (:mod:`gper.bench.peers.flashbax`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gper.bench.harness import fill
from gper.bench.peers.base import Setting, Skip, flashbax_status, require, trajectory_ops_at
from gper.bench.peers.jax_peer import SCAN_STEPS, JaxPeer
from gper.bench.workload import ALPHA, BETA, EPS, FILL_CHUNK, GAMMA, N_STEP, jax_td_errors

NAMES = ("flashbax-traj",)
#: the ops it is timed on (no sequences: their length is fixed when the buffer is made)
FLASHBAX_TRAJ_OPS = ("sample-n1", "sample-n3", "step-n1", "step-n3", "add-envs")
WHERE_TIME_GOES = {
    "flashbax-traj": "sample: stratified descent of the sum tree (a lax.cond per level), get_probability, then a "
    "gather of n + 1 steps per sample ([B, n + 1] indices into [num_envs, T]) and the n-step return from them; "
    "set_priorities and add: on GPU set_batch_bincount over the whole tree (O(N) a call); add also computes the "
    "newly valid and invalid starts. A single jitted step makes XLA copy the tree; jit-split does not.",
}


def ops_of(impl: str) -> tuple[str, ...]:
    return FLASHBAX_TRAJ_OPS


def ops_at(impl: str, b: int, setting: Setting) -> tuple[str, ...]:
    return trajectory_ops_at(FLASHBAX_TRAJ_OPS, b, setting)


def nstep_transitions(jnp, seq: dict, n: int, gamma: float) -> dict:
    """Sequences ``[B, n + 1, ...]`` of steps -> n-step transitions ``[B, ...]`` (as gper's trajectory buffer
    returns them: the return summed in float32 in step order, stopping after the first end of an episode)."""
    ended = seq["terminated"][:, :n] | seq["truncated"][:, :n]
    # alive[:, i]: no step before step i ended the episode, so step i is still in it
    before = jnp.concatenate([jnp.zeros_like(ended[:, :1]), ended[:, :-1]], axis=1)
    alive = jnp.cumprod(1.0 - before.astype(jnp.float32), axis=1)
    ret = jnp.zeros(ended.shape[0], jnp.float32)
    for i in range(n):  # in order, as gper sums
        ret = ret + alive[:, i] * jnp.float32(gamma**i) * seq["reward"][:, i]
    m = jnp.sum(alive, axis=1).astype(jnp.int32)  # steps taken, 1..n
    next_obs = jnp.take_along_axis(seq["obs"], m[:, None, None], axis=1)[:, 0]
    inside = alive > 0
    terminated = jnp.any(seq["terminated"][:, :n] & inside, axis=1)
    truncated = jnp.any(seq["truncated"][:, :n] & inside, axis=1)
    discount = jnp.where(terminated, 0.0, jnp.float32(gamma) ** m)
    return {
        "obs": seq["obs"][:, 0],
        "action": seq["action"][:, 0],
        "reward": ret,
        "next_obs": next_obs,
        "terminated": terminated,
        "truncated": truncated,
        "discount": discount,
    }


class FlashbaxTrajPeer(JaxPeer):
    """flashbax's prioritised trajectory buffer, every call jitted, the state donated to add and set_priorities."""

    modes = ("jit",)

    def __init__(self, capacity: int, setting: Setting) -> None:
        self.capacity, self.device, self.setting = capacity, setting.device, setting
        require("jax", "flashbax")
        import jax
        import jax.numpy as jnp
        from flashbax import make_prioritised_trajectory_buffer
        from flashbax.buffers.prioritised_trajectory_buffer import get_invalid_indices

        w = self.w = setting.traj
        self.jax, self.jnp, self.get_invalid_indices = jax, jnp, get_invalid_indices
        self.int_dtype = jnp.int32
        self.impls = NAMES
        self.rows = capacity // w.num_envs  # the time axis
        if capacity % w.num_envs or self.rows < N_STEP + 2:
            raise Skip(f"capacity {capacity} does not make num_envs {w.num_envs} rows of at least {N_STEP + 2} steps")
        backend = "gpu" if self.device.type == "cuda" else "cpu"
        self.make = lambda b, n: make_prioritised_trajectory_buffer(
            add_batch_size=w.num_envs,
            sample_batch_size=b,
            sample_sequence_length=n + 1,
            period=1,
            min_length_time_axis=n + 1,
            max_length_time_axis=self.rows,
            priority_exponent=ALPHA,
            device=backend,
        )
        example = {
            "obs": jnp.zeros(51, jnp.float32),
            "action": jnp.zeros((), jnp.int32),
            "reward": jnp.zeros((), jnp.float32),
            "terminated": jnp.zeros((), bool),
            "truncated": jnp.zeros((), bool),
        }
        self.adder = self.make(min(setting.batches), N_STEP)  # keeps the validity of the longest sequences
        self.key = jax.random.PRNGKey(setting.seed)
        self.gen_steps = jax.jit(self._random_steps, static_argnums=1)
        self.gen_td = jax.jit(partial(jax_td_errors, jax), static_argnums=1)
        self.state = self.adder.init(example)
        add = jax.jit(self.adder.add, donate_argnums=0)
        per_add = min(FILL_CHUNK // w.num_envs, self.rows)

        def add_chunk(lo: int, hi: int) -> None:
            for _ in range(0, hi // w.num_envs - lo // w.num_envs, per_add):
                self.state = add(self.state, self.gen_steps(self._next_key(), per_add))
            jax.block_until_ready(self.state)

        fill(capacity, add_chunk, setting.fill_limit_s(), f"filling flashbax's trajectory buffer to {capacity:,} slots")
        self.set_all = jax.jit(self.adder.set_priorities, donate_argnums=0)
        self.randomize_priorities()

    def _random_steps(self, key, t: int) -> dict:
        """``[num_envs, t]`` random steps, ending episodes at ``end_prob`` (half terminated, half truncated)."""
        jax, jnp, e, p = self.jax, self.jnp, self.w.num_envs, self.w.end_prob
        k = jax.random.split(key, 4)
        u = jax.random.uniform(k[3], (e, t))
        return {
            "obs": jax.random.normal(k[0], (e, t, 51), jnp.float32),
            "action": jax.random.randint(k[1], (e, t), 0, 18, jnp.int32),
            "reward": jax.random.normal(k[2], (e, t), jnp.float32),
            "terminated": u < p / 2,
            "truncated": (u >= p / 2) & (u < p),
        }

    def randomize_priorities(self) -> None:
        """Every start at the priority of a random TD error, then the starts whose 4 steps cross the write head at 0."""
        jnp = self.jnp
        self._set_random_priorities()
        invalid = self.get_invalid_indices(self.state, N_STEP + 1, 1, self.w.num_envs, self.rows).reshape(-1)
        self.state = self.set_all(self.state, invalid, jnp.zeros(invalid.shape, jnp.float32))
        self.jax.block_until_ready(self.state)

    def prepare(self, b: int, first: bool) -> None:
        super().prepare(b, first)
        jax, jnp, cap = self.jax, self.jnp, self.capacity
        self.new = self.gen_steps(self._next_key(), 1)
        samplers = {n: self.make(b, n) for n in (1, N_STEP)}
        adder = self.adder

        def sample(state, key, n):
            key, sub = jax.random.split(key)
            s = samplers[n].sample(state, sub)
            w = (s.probabilities * cap) ** -BETA
            return key, nstep_transitions(jnp, s.experience, n, GAMMA), w / jnp.max(w), s.indices

        def update(state, index, td):
            return adder.set_priorities(state, index, jnp.abs(td) + EPS)

        def step(state, key, td, n):
            key, batch, weights, index = sample(state, key, n)
            return update(state, index, td), key, batch, weights

        def steps(state, key, td, n):
            # SCAN_STEPS steps in one compiled loop; a checksum of every field keeps XLA from dropping the gathers
            def body(carry, _):
                state, key, acc = carry
                state, key, batch, weights = step(state, key, td, n)
                total = weights.sum() + sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree_util.tree_leaves(batch))
                return (state, key, acc + total), None

            (state, key, acc), _ = jax.lax.scan(body, (state, key, jnp.float32(0)), None, length=SCAN_STEPS)
            return state, key, acc

        self.f_sample = jax.jit(sample, static_argnums=2)
        self.f_update = jax.jit(update, donate_argnums=0)
        self.f_step = jax.jit(step, donate_argnums=0, static_argnums=3)
        self.f_steps = jax.jit(steps, donate_argnums=0, static_argnums=3)
        self.f_add = jax.jit(adder.add, donate_argnums=0)

    def ops_at(self, impl: str, b: int) -> tuple[str, ...]:
        return ops_at(impl, b, self.setting)

    def op(self, impl: str, name: str, b: int, mode: str = "eager") -> Callable[[], object]:
        td, new = self.td, self.new
        kind, _, n = name.partition("-n")
        n = int(n) if n.isdigit() else 0

        def sample():
            self.key, batch, weights, _ = self.f_sample(self.state, self.key, n)
            return batch, weights

        def step():
            self.state, self.key, batch, weights = self.f_step(self.state, self.key, td, n)
            return self.state, batch, weights

        def step_split():
            self.key, batch, weights, drawn = self.f_sample(self.state, self.key, n)
            self.state = self.f_update(self.state, drawn, td)
            return self.state, batch, weights

        def step_scan():
            self.state, self.key, acc = self.f_steps(self.state, self.key, td, n)
            return self.state, acc

        def add():
            self.state = self.f_add(self.state, new)
            return self.state

        if name == "add-envs":
            return add
        if kind == "sample":
            return sample
        if kind == "step":
            return {"jit": step, "jit-split": step_split, "jit-scan": step_scan}[mode]
        raise ValueError(f"unknown op {name!r}")

    def modes_of(self, op: str) -> tuple[str, ...]:
        return ("jit", "jit-split", "jit-scan") if op.startswith("step") else ("jit",)


def build(impls: tuple[str, ...], capacity: int, setting: Setting) -> FlashbaxTrajPeer:
    """In the flashbax worker process only: see :func:`gper.bench.peers.flashbax.time_in_worker`."""
    return FlashbaxTrajPeer(capacity, setting)


#: installed (checked without importing JAX), as the flat buffer's peers
status = flashbax_status

"""What the trajectory buffer's tests share: the spec, a buffer and its oracle fed the same random
streams (:class:`Run`), and item-by-item comparisons of what the buffer draws against the oracle."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

import gper
from trajectory_oracle import TrajectoryOracle
from trajectory_streams import StreamGenerator

SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64), "reward": ((), torch.float32)}
#: a second observation key (``Run(pixels=True)``): two bytes taken from the bits of ``obs``
PIXEL_SPEC = {**SPEC, "pixels": ((2,), torch.uint8)}

#: a stored priority against the oracle's float64 value: float32 rounding of |td| + eps (or of
#: the R2D2 mix, whose float32 mean of L terms rounds L times, L <= 16 here) and float32 pow
PRIORITY_RTOL = 1e-5
#: an IS weight (p_i / p_min) ** -beta from float32 priorities: both priorities' error, times beta <= 1,
#: plus float32 pow
WEIGHT_RTOL = 3e-5


def numpy_spec(spec: dict) -> dict:
    return {name: (shape, torch.empty(0, dtype=dt).numpy().dtype) for name, (shape, dt) in spec.items()}


def to_torch(data: dict[str, np.ndarray], device="cpu") -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v).copy()).to(device) for k, v in data.items()}


def bits(x: np.ndarray) -> np.ndarray:
    """The raw bits of an array (floats as same-width unsigned ints), for bit-for-bit comparison."""
    x = np.ascontiguousarray(x)
    if x.dtype.kind == "f":
        return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
    return x


def assert_field(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """``got`` equals ``want`` bit for bit (NaN equals the same NaN, 0.0 differs from -0.0)."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    same = np.array_equal(bits(got), bits(want))
    assert same, f"{what}: got {got!r} (bits {bits(got)!r}), expected {want!r} (bits {bits(want)!r})"


def snapshot(rb) -> dict:
    """A deep copy of ``rb.state_dict()``: every tensor cloned."""
    out = {}
    for k, v in rb.state_dict().items():
        out[k] = v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
    return out


def assert_unchanged(rb, before: dict) -> None:
    """Every tensor of ``rb.state_dict()`` is bit for bit the one in ``before``, the rest equal."""
    after = snapshot(rb)
    assert after.keys() == before.keys()
    for k, v in before.items():
        if isinstance(v, torch.Tensor):
            a = after[k]
            same = a.shape == v.shape and a.dtype == v.dtype and torch.equal(a.view(torch.uint8), v.view(torch.uint8))
            assert same, f"state_dict()[{k!r}] changed"
        else:
            assert after[k] == v, f"state_dict()[{k!r}]: {after[k]!r} != {v!r}"


def make_buffer(capacity: int, num_envs: int, window: int, backend: str = "torch", spec=SPEC, **kw):
    return gper.TrajectoryReplayBuffer(capacity, num_envs, spec, window=window, device="cpu", backend=backend, **kw)


def pixels_of(obs: np.ndarray) -> np.ndarray:
    """[E, 2] uint8 from [E, 3] float32 observations: equal observations give equal pixels."""
    return ((obs.view(np.uint32)[:, 1:] >> 9) & 0xFF).astype(np.uint8)


class Run:
    """A buffer and its oracle fed the same random streams, and the checks of one against the other."""

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        window: int,
        backend: str = "torch",
        seed: int = 0,
        alpha: float = 0.6,
        eps: float = 1e-3,
        stream_seed: int | None = None,
        pixels: bool = False,
        **kw,
    ):
        self.spec, self.obs_keys = (PIXEL_SPEC, ("obs", "pixels")) if pixels else (SPEC, ("obs",))
        self.rb = make_buffer(
            capacity,
            num_envs,
            window,
            backend,
            self.spec,
            seed=seed,
            alpha=alpha,
            eps=eps,
            obs_keys=self.obs_keys,
            **kw,
        )
        self.orc = TrajectoryOracle(capacity, num_envs, numpy_spec(self.spec), window, alpha, eps, self.obs_keys)
        seed_of_streams = seed if stream_seed is None else stream_seed
        self.gen = StreamGenerator(num_envs, seed=seed_of_streams, long_length=3 * (capacity // num_envs))
        self.window, self.capacity = window, capacity
        self.rng = np.random.default_rng(seed_of_streams + 1)

    def add(self) -> None:
        data = self.gen.step()
        if "pixels" in self.obs_keys:
            data |= {"pixels": pixels_of(data["obs"]), "next_pixels": pixels_of(data["next_obs"])}
        self.rb.add(to_torch(data))
        self.orc.add(data)

    # ---------------------------------------------------------------- state

    def check_state(self, what: str = "") -> None:
        """Drawable starts, priorities and counters equal the oracle's."""
        got = self.rb.drawable()
        assert got.dtype == torch.bool and got.shape == (self.capacity,), (got.dtype, got.shape)
        want = self.orc.drawable()
        diff = [i for i in range(self.capacity) if bool(got[i]) != want[i]]
        assert not diff, (
            f"{what}: drawable differs at slots {diff[:8]}: buffer {[bool(got[i]) for i in diff[:8]]}, "
            f"oracle {[want[i] for i in diff[:8]]} (rows per stream {self.orc.counts()})"
        )
        prio = self.rb.priorities(torch.arange(self.capacity)).tolist()
        for i, (p, q) in enumerate(zip(prio, self.orc.priorities, strict=True)):
            assert math.isclose(p, q, rel_tol=PRIORITY_RTOL), f"{what}: priority of slot {i}: {p} != oracle {q}"
        stats = self.rb.stats()
        for key in ("discontinuities", "stale_updates", "invalid_indices", "nonfinite_td"):
            assert stats[key] == getattr(self.orc, key), (
                f"{what}: stats()[{key!r}] {stats[key]} != oracle {getattr(self.orc, key)}"
            )
        assert stats["steps"] == self.orc.adds, f"{what}: stats()['steps'] {stats['steps']} != {self.orc.adds} adds"
        held = sum(min(c, self.orc.T) for c in self.orc.counts())
        assert stats["size"] == held, f"{what}: stats()['size'] {stats['size']} != {held} rows held"
        if "drawable" in stats:
            assert stats["drawable"] == sum(want), f"{what}: stats()['drawable'] {stats['drawable']} != {sum(want)}"

    # -------------------------------------------------------------- samples

    def check_batch_common(self, batch, beta: float | None, what: str) -> tuple[list[int], list[int]]:
        """Every draw is a drawable start; generations and global IS weights as the oracle's."""
        idx = batch.indices.tolist()
        assert batch.indices.dtype == torch.int64
        for i in idx:
            assert self.orc.drawable_flags[i], f"{what}: drew slot {i}, which is not a drawable start"
        gens = [self.orc.generations[i] for i in idx]
        assert batch.generations.tolist() == gens, f"{what}: generations {batch.generations.tolist()} != {gens}"
        b = 0.4 if beta is None else float(beta)
        want = self.orc.weights(idx, b)
        got = batch.weights.tolist()
        assert batch.weights.dtype == torch.float32
        for n, (w, v) in enumerate(zip(got, want, strict=True)):
            assert math.isclose(w, v, rel_tol=WEIGHT_RTOL), f"{what}: weight {n} (slot {idx[n]}) {w} != {v}"
        return idx, gens

    def check_sample(self, b: int, n_step: int, gamma, beta=None, what: str = ""):
        """Draw ``b`` transitions and compare every field of every draw with the oracle's."""
        g_host = None if gamma is None else float(gamma)
        batch = self.rb.sample(b, n_step=n_step, gamma=gamma, beta=beta)
        what = f"{what} sample(n_step={n_step}, gamma={g_host})"
        idx, gens = self.check_batch_common(batch, beta, what)
        got = {name: batch[name].numpy() for name in batch}
        names = [*self.spec, *("next_" + k for k in self.obs_keys), "terminated", "truncated", "discount"]
        assert sorted(got) == sorted(names), f"{what}: fields {sorted(got)}"
        for n, slot in enumerate(idx):
            want = self.orc.transition(slot, n_step, g_host)
            for name in names:
                assert_field(got[name][n], want[name], f"{what} item {n} (slot {slot}) {name!r}")
        return batch, idx, gens

    def check_sequences(self, b: int, length: int, burn_in: int, beta=None, what: str = "", zeros: bool = True):
        """Draw ``b`` sequences and compare the mask and every field of every step with the oracle's:
        the steps the mask keeps (and each one's ``next_obs``), and with ``zeros`` also the zeros
        of the steps it drops."""
        seq = self.rb.sample_sequences(b, length, burn_in=burn_in, beta=beta)
        what = f"{what} sample_sequences(length={length}, burn_in={burn_in})"
        idx, gens = self.check_batch_common(seq, beta, what)
        names = [*self.spec, *("next_" + k for k in self.obs_keys), "terminated", "truncated", "mask"]
        got = {name: seq[name].numpy() for name in names}
        assert sorted(seq) == sorted(names), f"{what}: fields {sorted(seq)}"
        masks = []
        for n, slot in enumerate(idx):
            want = self.orc.sequence(slot, length, burn_in)
            keep = [p for p, m in enumerate(want["mask"]) if m or zeros]
            assert_field(got["mask"][n], np.stack(want["mask"]), f"{what} item {n} (slot {slot}) 'mask'")
            for name in names:
                assert_field(got[name][n][keep], np.stack(want[name])[keep], f"{what} item {n} (slot {slot}) {name!r}")
            masks.append([bool(m) for m in want["mask"][burn_in:]])
        return seq, idx, gens, masks

    # -------------------------------------------------------------- updates

    def random_td(self, shape) -> np.ndarray:
        td = (self.rng.standard_normal(shape) * 10.0 ** self.rng.uniform(-2, 2, shape)).astype(np.float32)
        td[self.rng.random(shape) < 0.03] = np.nan
        return td

    def update_batch(self, batch, idx: list[int], gens: list[int]) -> None:
        td = self.random_td(len(idx))
        self.rb.update_priorities(batch, torch.from_numpy(td))
        vals = [self.orc.priority(float(x)) if math.isfinite(x) else None for x in td]
        self.orc.update(idx, vals, gens)

    def update_sequences(self, seq, idx: list[int], gens: list[int], masks: list[list[bool]], eta=None) -> None:
        td = self.random_td((len(idx), len(masks[0])))
        for n, m in enumerate(masks):
            for i, inside in enumerate(m):
                if not inside:
                    td[n, i] = 1e6  # outside the mask: must not count
        kw = {} if eta is None else {"eta": eta}
        self.rb.update_priorities(seq, torch.from_numpy(td), **kw)
        e = 0.9 if eta is None else eta
        self.orc.update(idx, [self.orc.sequence_priority(td[n], masks[n], e) for n in range(len(idx))], gens)

    def update_raw(self, k: int, drawable_only: bool = True) -> None:
        """``k`` raw slots: drawable starts, or any slot (those that are not drawable starts are
        dropped and counted)."""
        pool = [i for i, d in enumerate(self.orc.drawable()) if d or not drawable_only]
        idx = [pool[int(j)] for j in self.rng.integers(0, len(pool), k)]
        td = self.random_td(k)
        self.rb.update_priorities(torch.tensor(idx), torch.from_numpy(td))
        self.orc.update(idx, [self.orc.priority(float(x)) if math.isfinite(x) else None for x in td], None)

    def random_gamma(self, n_step: int):
        u = self.rng.random()
        if n_step == 1 and u < 0.2:
            return None
        if u < 0.3:
            return float(self.rng.choice([0.0, 1.0]))
        g = float(np.float32(self.rng.uniform(0.5, 1.0)))
        return torch.tensor(g, dtype=torch.float32) if u < 0.45 else g

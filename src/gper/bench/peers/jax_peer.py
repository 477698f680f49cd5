"""What the JAX peers (flashbax's flat and trajectory buffers) share: a PRNG key split per use,
random priorities set in chunks, and timing closed by ``block_until_ready``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gper.bench.harness import chunks
from gper.bench.peers.base import Peer
from gper.bench.timing import Timing, time_sync
from gper.bench.workload import EPS

#: PER steps per call of the ``jit-scan`` mode (a jitted lax.scan: JAX's counterpart of a CUDA graph)
SCAN_STEPS = 64


class JaxPeer(Peer):
    """A peer whose buffer state is JAX arrays. Subclasses set ``jax`` and ``jnp`` (the modules),
    ``key`` (a PRNG key), ``state`` (the buffer state), ``int_dtype`` (of its indices), and the
    jitted ``set_all(state, idx, priorities)`` and ``gen_td(key, n)``."""

    jax: Any
    jnp: Any
    key: Any
    state: Any
    int_dtype: Any
    set_all: Callable[..., Any]
    gen_td: Callable[..., Any]

    def _next_key(self):
        self.key, sub = self.jax.random.split(self.key)
        return sub

    def _set_random_priorities(self) -> None:
        """Every slot at the priority ``|td| + EPS`` of a random TD error (not yet waited for)."""
        jnp = self.jnp
        for lo, hi in chunks(self.capacity):
            idx = jnp.arange(lo, hi, dtype=self.int_dtype)
            self.state = self.set_all(self.state, idx, jnp.abs(self.gen_td(self._next_key(), hi - lo)) + EPS)

    def prepare(self, b: int, first: bool) -> None:
        """Fresh random priorities (but for the first batch size: the fill set them) and batch
        ``b``'s TD errors; a subclass then draws its new data and builds its jitted calls."""
        if not first:
            self.randomize_priorities()
        self.td = self.gen_td(self._next_key(), b)

    def steps_per_call(self, mode: str) -> int:
        return SCAN_STEPS if mode == "jit-scan" else 1

    def sync(self, out: object) -> None:
        self.jax.block_until_ready(out)

    def time(self, fn: Callable[[], object], warmup: int, iters: int, repeats: int) -> Timing:
        return time_sync(fn, self.sync, warmup, iters, repeats)

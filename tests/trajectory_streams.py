"""Random environment streams for the trajectory buffer's tests: what a vectorized environment
loop hands to ``TrajectoryReplayBuffer.add``, one step of every stream per call.

Each stream runs episodes of random length (many of length 1, some longer than the buffer's ring)
that end terminated, truncated or both, in one of Gymnasium's two autoreset styles:

* ``"next"`` (next-step autoreset): after a step that ends an episode, the next call is the reset
  step: its ``obs`` is the final observation, its action is ignored, its ``next_obs`` the reset
  observation, and neither flag is set;
* ``"same"`` (same-step autoreset): the step that ends an episode returns the reset observation
  as the next call's ``obs``; its ``next_obs`` is the final observation.

Now and then, mid-episode, a stream jumps to a new observation without a flag (a reset the flags
did not report, a discontinuity). Observations mix random floats with a pool of exact values
(0.0, -0.0, two NaNs of different sign, infinities, a denormal), so that values repeat exactly
across episodes, and a reset observation is often the final one with a single sign bit flipped:
only a bit-for-bit comparison tells those apart, and only it sees that NaN equals NaN.

The generator counts what it meant (episodes ended, discontinuities), so a test can check the
oracle read the streams as they were meant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: float32 bit patterns that float comparison gets wrong or that repeat across episodes
POOL_BITS = np.array(
    [0x00000000, 0x80000000, 0x7FC00000, 0xFFC00000, 0x7F800000, 0xFF800000, 0x00000001, 0x3F800000, 0xBF800000],
    dtype=np.uint32,
)
POOL = POOL_BITS.view(np.float32)


@dataclass
class EnvState:
    style: str
    obs: np.ndarray  # what the next add passes as obs
    length: int  # steps of the episode in progress
    t: int = 0  # steps taken in it
    reset_due: bool = False  # "next" style: the next add is the reset step
    can_jump: bool = False  # the last add was a step that did not end its episode


class StreamGenerator:
    """``num_envs`` random streams.

    Args:
        num_envs: streams.
        obs_shape: shape of the float32 ``obs``.
        seed: numpy seed.
        styles: autoreset styles to draw each stream's from ("next", "same").
        long_length: the longest episode (make it longer than the ring to wrap inside an episode).
        p_jump: chance per mid-episode step of an unflagged reset.
        fixed_reset: chance that a stream resets to the same observation every episode.
    """

    def __init__(
        self,
        num_envs: int,
        obs_shape: tuple[int, ...] = (3,),
        seed: int = 0,
        styles: tuple[str, ...] = ("next", "same"),
        long_length: int = 40,
        p_jump: float = 0.04,
        fixed_reset: float = 0.3,
    ):
        self.rng = np.random.default_rng(seed)
        self.num_envs, self.obs_shape = num_envs, obs_shape
        self.long_length, self.p_jump = long_length, p_jump
        self.resets = [self.random_obs() if self.rng.random() < fixed_reset else None for _ in range(num_envs)]
        self.envs = [
            EnvState(str(self.rng.choice(styles)), self.reset_obs(e, None), self.episode_length())
            for e in range(num_envs)
        ]
        self.episodes_ended = 0
        self.discontinuities = 0
        self.adds = 0

    def episode_length(self) -> int:
        u = self.rng.random()
        if u < 0.25:
            return 1
        if u < 0.5:
            return int(self.rng.integers(2, 5))
        if u < 0.85:
            return int(self.rng.integers(5, 16))
        return int(self.rng.integers(max(5, self.long_length // 3), self.long_length + 1))

    def random_obs(self) -> np.ndarray:
        x = (self.rng.standard_normal(self.obs_shape) * 10.0 ** self.rng.integers(-3, 4)).astype(np.float32)
        pick = self.rng.random(self.obs_shape) < 0.3
        x[pick] = POOL[self.rng.integers(0, len(POOL), int(pick.sum()))]
        return x

    def flip_one_sign(self, x: np.ndarray) -> np.ndarray:
        bits = x.copy().reshape(-1).view(np.uint32)
        bits[int(self.rng.integers(0, bits.size))] ^= np.uint32(0x80000000)
        return bits.view(np.float32).reshape(x.shape)

    def differing(self, candidate: np.ndarray, other: np.ndarray | None) -> np.ndarray:
        """``candidate``, made to differ from ``other`` in at least one bit."""
        if other is not None and candidate.tobytes() == other.tobytes():
            return self.flip_one_sign(candidate)
        return candidate

    def reset_obs(self, e: int, final: np.ndarray | None) -> np.ndarray:
        """A new episode's first observation, which must differ in its bits from ``final``."""
        if final is not None and self.rng.random() < 0.3:
            return self.flip_one_sign(final)  # 0.0 vs -0.0, NaN vs -NaN, x vs -x: bits only
        fixed = self.resets[e]
        return self.differing(fixed.copy() if fixed is not None else self.random_obs(), final)

    def next_obs(self, obs: np.ndarray) -> np.ndarray:
        u = self.rng.random()
        if u < 0.1:
            return obs.copy()  # the observation does not change
        if u < 0.2:
            return self.flip_one_sign(obs)
        return self.random_obs()

    def reward(self) -> np.float32:
        u = self.rng.random()
        if u < 0.05:
            return np.float32(-0.0)
        if u < 0.15:
            return np.float32(1.0)
        return np.float32(self.rng.standard_normal() * 10.0 ** self.rng.integers(-3, 4))

    def step(self) -> dict[str, np.ndarray]:
        """One add's data: ``obs``/``next_obs`` [E, *obs_shape] float32, ``action`` [E] int64,
        ``reward`` [E] float32, ``terminated``/``truncated`` [E] bool."""
        e_n = self.num_envs
        out = {
            "obs": np.zeros((e_n, *self.obs_shape), np.float32),
            "next_obs": np.zeros((e_n, *self.obs_shape), np.float32),
            "action": self.rng.integers(-(2**40), 2**40, e_n).astype(np.int64),
            "reward": np.zeros(e_n, np.float32),
            "terminated": np.zeros(e_n, bool),
            "truncated": np.zeros(e_n, bool),
        }
        for e, env in enumerate(self.envs):
            if env.reset_due:
                # next-step autoreset: the final observation again, then the reset observation
                out["obs"][e] = env.obs
                out["reward"][e] = self.reward()  # ignored with the action
                env.obs = self.reset_obs(e, None)
                out["next_obs"][e] = env.obs
                env.reset_due, env.can_jump = False, False
                env.t, env.length = 0, self.episode_length()
                continue
            if env.can_jump and self.rng.random() < self.p_jump:
                # a reset the flags do not report
                env.obs = self.reset_obs(e, env.obs)
                env.t, env.length = 0, self.episode_length()
                self.discontinuities += 1
            out["obs"][e] = env.obs
            out["reward"][e] = self.reward()
            nxt = self.next_obs(env.obs)
            out["next_obs"][e] = nxt
            env.t += 1
            if env.t < env.length:
                env.obs, env.can_jump = nxt, True
                continue
            u = self.rng.random()
            out["terminated"][e] = u < 0.6
            out["truncated"][e] = u >= 0.5  # both now and then, as Gymnasium allows
            self.episodes_ended += 1
            env.can_jump = False
            if env.style == "next":
                env.obs, env.reset_due = nxt, True
            else:
                env.obs = self.reset_obs(e, nxt)
                env.t, env.length = 0, self.episode_length()
        self.adds += 1
        return out

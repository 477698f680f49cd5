"""The Stable-Baselines3 adapter against SB3 itself: the same transitions drawn as from SB3's own
``ReplayBuffer`` (plain, vectorized, with timeouts, memory-optimised), IS weights in the DQN loss
(checked by hand on one batch), priorities and beta over a CartPole run, SAC/TD3/DDPG on the
buffer, save/load through SB3's pickles, SB3's log writers, and refusals of bad arguments.

On the CPU with the torch back end (one test draws with the Triton kernels under the
interpreter); the ``gpu`` tests train on CUDA under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import copy
import json
import math
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3 import DDPG, DQN, SAC, TD3  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.logger import KVWriter, Logger, configure  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: E402

from gper.integrations.sb3 import PrioritizedDQN, PrioritizedReplayBuffer, weighted_huber_loss  # noqa: E402
from gper.integrations.sb3.dqn import DeviceMean  # noqa: E402

BOX = spaces.Box(-10.0, 10.0, (3,), np.float32)
TWO = spaces.Discrete(2)
TORCH = dict(backend="torch")
#: small CartPole runs: few steps, a small network, no output
SMALL_DQN = dict(
    learning_starts=200,
    buffer_size=5000,
    train_freq=4,
    target_update_interval=250,
    exploration_fraction=0.3,
    policy_kwargs=dict(net_arch=[32, 32]),
    seed=0,
    device="cpu",
)


@pytest.fixture(autouse=True)
def one_thread():
    """torch on one CPU thread: these tiny networks gain nothing from more when the cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Stream:
    """Transitions as SB3's collect_rollouts stores them: ``obs`` of a step is the previous
    ``next_obs``, except after a done, where it is a fresh (reset) observation. Every observation
    is a fresh random vector, so a transition is known by its content."""

    def __init__(self, n_envs: int, seed: int = 0, p_done: float = 0.25, p_truncated: float = 0.5) -> None:
        self.rng = np.random.default_rng(seed)
        self.n, self.p_done, self.p_truncated = n_envs, p_done, p_truncated
        self.obs = self._obs()

    def _obs(self) -> np.ndarray:
        return self.rng.standard_normal((self.n, 3)).astype(np.float32)

    def feed(self, buffers: list, steps: int) -> None:
        for _ in range(steps):
            next_obs = self._obs()
            action = self.rng.integers(0, 2, self.n)
            reward = self.rng.standard_normal(self.n).astype(np.float32)
            done = self.rng.random(self.n) < self.p_done
            truncated = done & (self.rng.random(self.n) < self.p_truncated)
            infos = [{"TimeLimit.truncated": bool(t)} for t in truncated]
            for rb in buffers:
                rb.add(self.obs, next_obs, action, reward, done, infos)
            self.obs = np.where(done[:, None], self._obs(), next_obs)


def _key(obs, action, next_obs, done, reward) -> tuple:
    flat = lambda x: tuple(np.asarray(x, dtype=np.float64).ravel().tolist())
    return flat(obs), flat(action), flat(next_obs), float(done), float(reward)


def sb3_drawable(rb: ReplayBuffer) -> set[tuple]:
    """Every transition SB3's buffer can draw, read from its arrays as its ``_get_samples`` does."""
    bs = rb.buffer_size
    if rb.optimize_memory_usage:  # never the half-written step at pos
        steps = [(rb.pos + k) % bs for k in range(1, bs)] if rb.full else range(rb.pos)
    else:
        steps = range(rb.size())
    out = set()
    for i in steps:
        for e in range(rb.n_envs):
            nxt = rb.observations[(i + 1) % bs, e] if rb.optimize_memory_usage else rb.next_observations[i, e]
            done = rb.dones[i, e] * (1 - rb.timeouts[i, e])
            out.add(_key(rb.observations[i, e], rb.actions[i, e], nxt, done, rb.rewards[i, e]))
    return out


def drawn(samples) -> list[tuple]:
    cols = [x.cpu().numpy() for x in samples[:5]]
    return [_key(o, a, n, d[0], r[0]) for o, a, n, d, r in zip(*cols, strict=True)]


def pair(steps: int, n_envs: int, optimize: bool = False, timeouts: bool = True, **kwargs):
    kw = dict(optimize_memory_usage=optimize, handle_timeout_termination=timeouts)
    ours = PrioritizedReplayBuffer(steps * n_envs, BOX, TWO, "cpu", n_envs, **kw, **TORCH, seed=1, **kwargs)
    return ours, ReplayBuffer(steps * n_envs, BOX, TWO, "cpu", n_envs, **kw)


# ---------------------------------------------------------------------------- the buffer against SB3's


@pytest.mark.parametrize(
    "n_envs, optimize, timeouts",
    [(1, False, True), (4, False, True), (2, False, False), (1, True, False), (3, True, False)],
    ids=["1env", "4envs", "no-timeouts", "optimized-1env", "optimized-3envs"],
)
def test_draws_are_the_transitions_sb3_holds(n_envs, optimize, timeouts):
    """After every number of adds (first, before full, full, wrapped), the set of transitions drawn
    equals the set SB3's buffer can draw from the same adds, and pos/full/size() agree."""
    steps = 6
    ours, theirs = pair(steps, n_envs, optimize, timeouts)
    stream, added = Stream(n_envs), 0
    for upto in (1, steps - 1, steps, steps + 1, 3 * steps + 2):
        stream.feed([ours, theirs], upto - added)
        added = upto
        assert (ours.pos, ours.full, ours.size()) == (theirs.pos, theirs.full, theirs.size())
        want = sb3_drawable(theirs)
        got = drawn(ours.sample(4096))  # at most 6 * 4 transitions: each is drawn (seeded)
        assert set(got) == want, f"after {upto} adds"


def test_memory_optimised_rows_hold_each_observation_once():
    ours, _ = pair(5, 2, optimize=True, timeouts=False)
    assert "next_obs" not in ours.gper.spec and ours.gper.capacity == 4 * 2
    full, _ = pair(5, 2)
    assert set(full.gper.spec) == {"obs", "next_obs", "action", "reward", "done", "timeout"}


def test_timeouts_are_not_dones():
    """A done that is a time limit bootstraps (dones = 0) unless timeouts are not handled."""
    for handle, want in ((True, 0.0), (False, 1.0)):
        rb = PrioritizedReplayBuffer(4, BOX, TWO, "cpu", handle_timeout_termination=handle, **TORCH)
        rb.add(
            np.ones((1, 3)),
            np.ones((1, 3)),
            np.array([1]),
            np.array([1.0]),
            np.array([True]),
            [{"TimeLimit.truncated": True}],
        )
        assert rb.sample(8).dones.unique().tolist() == [want]


@pytest.mark.parametrize(
    "obs_space, action_space",
    [
        (BOX, TWO),
        (spaces.Discrete(5), spaces.Box(-1.0, 1.0, (2,), np.float64)),
        (spaces.MultiBinary(3), spaces.MultiDiscrete([3, 4])),
        (spaces.Box(0, 255, (2, 3, 3), np.uint8), spaces.Box(-1.0, 1.0, (1,), np.float32)),
    ],
    ids=["box-discrete", "discrete-box64", "multibinary-multidiscrete", "uint8-image"],
)
def test_samples_have_sb3s_shapes_and_dtypes(obs_space, action_space):
    n = 2
    obs_space.seed(0)
    action_space.seed(0)
    ours = PrioritizedReplayBuffer(8, obs_space, action_space, "cpu", n, **TORCH)
    theirs = ReplayBuffer(8, obs_space, action_space, "cpu", n)
    for _ in range(3):
        obs = np.stack([obs_space.sample() for _ in range(n)])
        nxt = np.stack([obs_space.sample() for _ in range(n)])
        action = np.stack([action_space.sample() for _ in range(n)])
        for rb in (ours, theirs):
            rb.add(obs, nxt, action, np.zeros(n), np.zeros(n), [{}] * n)
    a, b = ours.sample(5), theirs.sample(5)
    for name in ("observations", "actions", "next_observations", "dones", "rewards"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x.shape, x.dtype) == (y.shape, y.dtype), name
    assert a.discounts is None and b.discounts is None
    assert (a.weights.shape, a.weights.dtype, a.indices.shape, a.indices.dtype) == (
        (5, 1),
        torch.float32,
        (5,),
        torch.int64,
    )


def test_vec_normalize_is_applied_as_sb3_applies_it():
    venv = VecNormalize(DummyVecEnv([lambda: __import__("gymnasium").make("Pendulum-v1")]))
    venv.obs_rms.mean, venv.obs_rms.var = np.array([0.5, -0.5, 1.0]), np.array([4.0, 0.25, 1.0])
    venv.ret_rms.var = np.array(9.0)
    rb = PrioritizedReplayBuffer(16, BOX, TWO, "cpu", **TORCH)
    Stream(1).feed([rb], 10)
    twin = copy.deepcopy(rb)  # draws the same batch
    normed, raw = rb.sample(32, env=venv), twin.sample(32)
    assert torch.equal(normed.indices, raw.indices)
    for got, x in ((normed.observations, raw.observations), (normed.next_observations, raw.next_observations)):
        torch.testing.assert_close(got, torch.as_tensor(venv.normalize_obs(x.numpy())))
    torch.testing.assert_close(normed.rewards, torch.as_tensor(venv.normalize_reward(raw.rewards.numpy())).float())


def test_update_priorities_sets_the_drawn_and_ignores_stale_batches():
    rb, _ = pair(8, 2)
    Stream(2).feed([rb], 8)
    s = rb.sample(16)
    td = torch.linspace(-2.0, 3.0, 16)
    rb.update_priorities(s, td[:, None])  # [B, 1], like the Q-values
    last = {int(i): float(t) for i, t in zip(s.indices, td, strict=True)}  # the last duplicate wins
    want = torch.tensor([(abs(t) + rb.gper.eps) ** rb.alpha for t in last.values()])
    torch.testing.assert_close(rb.gper.priorities(torch.tensor(list(last))), want)
    with pytest.raises(ValueError, match=r"\[B\] or \[B, 1\]"):
        rb.update_priorities(s, torch.zeros(16, 2))
    rb.reset()
    assert (rb.pos, rb.full, rb.size(), len(rb.gper)) == (0, False, 0, 0)
    Stream(2, seed=1).feed([rb], 3)
    rb.update_priorities(s, td)  # drawn before the reset: left alone
    assert rb.gper.stats()["stale_updates"] == 16


def test_learn_cuts_the_last_trajectory_of_a_memory_optimised_buffer():
    """SB3's learn() sets ``dones[newest step] = True`` on a memory-optimised buffer; the same
    assignment on both buffers leaves the same drawable transitions."""
    ours, theirs = pair(5, 2, optimize=True, timeouts=False)
    Stream(2, p_done=0.0).feed([ours, theirs], 7)  # wrapped
    for rb in (ours, theirs):
        rb.dones[(rb.pos - 1) % rb.buffer_size] = True
    assert set(drawn(ours.sample(4096))) == sb3_drawable(theirs)
    assert ours.dones[(ours.pos - 1) % ours.buffer_size].tolist() == [1.0, 1.0]
    # and through SB3's own learn(), twice
    kwargs = dict(
        replay_buffer_class=PrioritizedReplayBuffer,
        replay_buffer_kwargs=dict(handle_timeout_termination=False, **TORCH),
    )
    model = DQN(
        "MlpPolicy", "CartPole-v1", optimize_memory_usage=True, **(SMALL_DQN | dict(learning_starts=50)), **kwargs
    )
    model.learn(120)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The last trajectory in the replay buffer will be truncated")
        model.learn(120)
    assert model.replay_buffer.size() == 240


# ---------------------------------------------------------------------------- PrioritizedDQN


def test_prioritized_dqn_on_cartpole_moves_priorities_and_anneals_beta():
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=TORCH, **SMALL_DQN)
    assert model.beta_start == 0.4 and model.replay_buffer.beta == 0.4
    model.learn(2400)
    rb = model.replay_buffer
    assert model._n_updates == (2400 - 200) // 4
    assert rb.beta == pytest.approx(1.0, abs=1e-3)  # the last train() ran at progress 1
    p = rb.gper.priorities(torch.arange(len(rb.gper)))
    assert p.std() / p.mean() > 0.2  # every item entered at the same (max) priority
    model._current_progress_remaining = 0.75  # a quarter of the run: beta a quarter of the way to 1
    assert model.annealed_beta() == pytest.approx(0.55)


def test_the_loss_is_the_is_weighted_huber_loss_of_the_batch():
    """One train() step by hand: the same batch (drawn from a copy of the buffer), the same
    networks; the logged loss and the new priorities agree with the hand computation."""
    model = PrioritizedDQN(
        "MlpPolicy", "CartPole-v1", replay_buffer_kwargs=TORCH, **(SMALL_DQN | dict(learning_starts=10**6))
    )
    model.learn(300)  # collects, never trains
    rb = model.replay_buffer
    rng = torch.Generator().manual_seed(0)
    rb.update_priorities(torch.arange(300), torch.rand(300, generator=rng) * 5)  # weights that differ
    twin, q_net = copy.deepcopy(rb), copy.deepcopy(model.q_net)
    model._current_progress_remaining = 0.5
    model.train(gradient_steps=1, batch_size=64)
    logged = float(model.logger.name_to_value["train/loss"])

    twin.beta = 0.7  # what train() annealed to at progress 0.5
    s = twin.sample(64)
    with torch.no_grad():
        current = q_net(s.observations).gather(1, s.actions.long())
        target = (
            s.rewards + (1 - s.dones) * model.gamma * model.q_net_target(s.next_observations).max(1).values[:, None]
        )
        d = current - target
        huber = torch.where(d.abs() < 1, 0.5 * d**2, d.abs() - 0.5)
    assert s.weights.std() / s.weights.mean() > 0.1 and s.weights.max() <= 1
    assert logged == pytest.approx(float((s.weights * huber).mean()), rel=1e-5)
    assert logged != pytest.approx(float(huber.mean()), rel=1e-2)  # the weights matter
    last = {int(i): float(t) for i, t in zip(s.indices, d[:, 0].abs(), strict=True)}
    want = torch.tensor([(t + rb.gper.eps) ** rb.alpha for t in last.values()])
    torch.testing.assert_close(rb.gper.priorities(torch.tensor(list(last))), want, rtol=1e-5, atol=1e-6)


def test_weighted_huber_loss():
    current, target = torch.tensor([[0.0], [3.0]]), torch.tensor([[0.5], [0.0]])
    assert float(weighted_huber_loss(current, target, torch.tensor([[1.0], [0.5]]))) == pytest.approx(
        (0.125 + 1.25) / 2
    )
    with pytest.raises(ValueError, match=r"\[B, B\]|shape"):
        weighted_huber_loss(current, target, torch.ones(2))  # [B] would broadcast to [B, B]


def test_four_envs_through_make_vec_env():
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0)
    model = PrioritizedDQN("MlpPolicy", env, replay_buffer_kwargs=TORCH, **SMALL_DQN)
    model.learn(1200)
    rb = model.replay_buffer
    assert (rb.n_envs, rb.buffer_size, rb.size(), len(rb.gper)) == (4, 1250, 300, 1200)
    p = rb.gper.priorities(torch.arange(1200))
    assert p.std() / p.mean() > 0.1


@pytest.mark.parametrize("algo", [SAC, TD3, DDPG])
def test_sac_td3_ddpg_train_on_the_gper_buffer(algo):
    model = algo(
        "MlpPolicy",
        "Pendulum-v1",
        buffer_size=1000,
        learning_starts=100,
        batch_size=64,
        policy_kwargs=dict(net_arch=[32, 32]),
        replay_buffer_class=PrioritizedReplayBuffer,
        replay_buffer_kwargs=TORCH,
        seed=0,
        device="cpu",
    )
    model.learn(250)
    rb = model.replay_buffer
    assert isinstance(rb, PrioritizedReplayBuffer) and rb.size() == 250 and model._n_updates == 150
    s = rb.sample(8)
    assert s.actions.shape == (8, 1) and s.actions.dtype == torch.float32 and s.actions.abs().max() <= 1


def test_triton_kernels_draw_what_the_torch_ones_draw():
    """The Triton back end (under the interpreter on the CPU) behind the adapter: the same draws."""
    buffers = [PrioritizedReplayBuffer(12, BOX, TWO, "cpu", 2, backend=b, seed=5) for b in ("torch", "triton")]
    Stream(2).feed(buffers, 4)
    a, b = (rb.sample(16) for rb in buffers)
    assert buffers[1].gper.backend == "triton"
    assert torch.equal(a.indices, b.indices) and torch.equal(a.observations, b.observations)
    torch.testing.assert_close(a.weights, b.weights)


# ---------------------------------------------------------------------------- save, load, logs


@pytest.mark.parametrize("optimize", [False, True], ids=["plain", "optimized"])
def test_save_and_load_replay_buffer_reproduce_the_draws(tmp_path, optimize):
    kwargs = dict(
        optimize_memory_usage=optimize, replay_buffer_kwargs=dict(handle_timeout_termination=not optimize, **TORCH)
    )
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", **(SMALL_DQN | dict(learning_starts=100)), **kwargs)
    model.learn(400)
    rb = model.replay_buffer
    model.save_replay_buffer(tmp_path / "rb.pkl")
    # the file holds the filled rows (400 of the buffer's), not its whole capacity
    row_bytes = rb.gper.state_dict()["rows"][0].numel()
    # (the trees take 8 bytes a slot of capacity; the whole rows would be 5000 * row_bytes)
    assert (tmp_path / "rb.pkl").stat().st_size < 400 * row_bytes + 12 * rb.gper.capacity + 10_000
    other = PrioritizedDQN("MlpPolicy", "CartPole-v1", **SMALL_DQN, **kwargs)
    other.load_replay_buffer(tmp_path / "rb.pkl")
    loaded = other.replay_buffer
    assert loaded is not rb and (loaded.pos, loaded.full, loaded.size(), loaded.beta) == (
        rb.pos,
        rb.full,
        rb.size(),
        rb.beta,
    )
    for _ in range(2):
        a, b = rb.sample(64), loaded.sample(64)
        for x, y in zip(a[:8], b[:8], strict=True):
            assert (x is None and y is None) or torch.equal(x, y)
        for r in (rb, loaded):
            r.update_priorities(a if r is rb else b, torch.ones(64))
    other.learn(100, reset_num_timesteps=False)  # and it trains on


def test_a_file_of_another_buffer_is_refused_and_the_model_keeps_its_own(tmp_path):
    DQN("MlpPolicy", "CartPole-v1", **SMALL_DQN).save_replay_buffer(tmp_path / "sb3.pkl")
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=TORCH, **SMALL_DQN)
    mine = model.replay_buffer
    with pytest.raises(TypeError, match="holds a ReplayBuffer"):
        model.load_replay_buffer(tmp_path / "sb3.pkl")
    assert model.replay_buffer is mine


def test_model_save_and_load(tmp_path):
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=0.5, **TORCH), **SMALL_DQN)
    model.learn(250)
    model.save(tmp_path / "model.zip")
    back = PrioritizedDQN.load(tmp_path / "model.zip", device="cpu")
    assert isinstance(back.replay_buffer, PrioritizedReplayBuffer) and back.replay_buffer.alpha == 0.5
    obs = np.zeros((1, 4), np.float32)
    assert back.predict(obs, deterministic=True)[0] == model.predict(obs, deterministic=True)[0]


class Received(KVWriter):
    """An SB3 output format that keeps what it was handed (TensorBoard's writer drops all but numbers)."""

    def __init__(self) -> None:
        self.values: list[dict] = []

    def write(self, key_values, key_excluded, step=0) -> None:
        self.values.append(dict(key_values))


def test_sb3s_writers_show_a_device_mean(tmp_path):
    """The log, CSV and JSON writers read a DeviceMean themselves; PrioritizedDQN's dump_logs
    hands every writer a float (what TensorBoard's add_scalar needs)."""
    logger = configure(str(tmp_path), ["log", "csv", "json"])
    mean = DeviceMean(torch.tensor(3.0), 2)
    logger.record("train/loss", mean)
    logger.dump(1)
    logger.close()
    assert "1.5" in (tmp_path / "log.txt").read_text()
    assert (tmp_path / "progress.csv").read_text().splitlines() == ["train/loss", "1.5"]
    assert json.loads((tmp_path / "progress.json").read_text()) == {"train/loss": 1.5}
    assert f"{mean:.2f}" == "1.50" and math.isnan(float(DeviceMean(torch.zeros(()), 0)))
    model = PrioritizedDQN(
        "MlpPolicy", "CartPole-v1", replay_buffer_kwargs=TORCH, **(SMALL_DQN | dict(learning_starts=50))
    )
    received = Received()
    model.set_logger(Logger(None, [received]))
    model.learn(100, log_interval=1)
    dumped = [v["train/loss"] for v in received.values if "train/loss" in v]
    assert dumped and all(type(v) is float for v in dumped)


# ---------------------------------------------------------------------------- bad arguments


def test_bad_arguments_are_refused():
    dict_space = spaces.Dict({"a": BOX})
    with pytest.raises(TypeError, match="not Dict"):
        PrioritizedReplayBuffer(10, dict_space, TWO, "cpu")
    with pytest.raises(ValueError, match="simultaneously"):
        PrioritizedReplayBuffer(10, BOX, TWO, "cpu", optimize_memory_usage=True)
    with pytest.raises(ValueError, match="buffer_size >= 2 \\* n_envs"):
        PrioritizedReplayBuffer(3, BOX, TWO, "cpu", 2, optimize_memory_usage=True, handle_timeout_termination=False)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="buffer_size must be an int"):
            PrioritizedReplayBuffer(bad, BOX, TWO, "cpu")
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplayBuffer(10, BOX, TWO, "cpu", alpha=2.0)
    with pytest.raises(ValueError, match="sampling"):
        PrioritizedReplayBuffer(10, BOX, TWO, "cpu", sampling="greedy")
    rb = PrioritizedReplayBuffer(10, BOX, TWO, "cpu", 2, **TORCH)
    with pytest.raises(RuntimeError, match="empty"):
        rb.sample(4)
    ok = dict(
        obs=np.zeros((2, 3)),
        next_obs=np.zeros((2, 3)),
        action=np.zeros(2),
        reward=np.zeros(2),
        done=np.zeros(2),
        infos=[{}, {}],
    )
    for change in (dict(obs=np.zeros((1, 3))), dict(action=np.zeros(3)), dict(infos=[{}])):
        with pytest.raises(ValueError, match="add\\(\\)"):
            rb.add(**(ok | change))
    assert (rb.pos, len(rb.gper)) == (0, 0)  # nothing stored
    rb.add(**ok)
    with pytest.raises(ValueError, match="beta"):
        rb.beta = 1.5
    with pytest.raises(TypeError, match="replay_buffer_class"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer, device="cpu")
    with pytest.raises(ValueError, match="n_steps must be 1"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", n_steps=3, device="cpu")
    with pytest.raises(TypeError, match="by keyword"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", 1e-4, 1000, 100, 32, 1.0, 0.99, 4, 1, ReplayBuffer)


# ---------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_prioritized_dqn_on_cuda_trains_without_syncing(graphs):
    """A few hundred CartPole steps on CUDA; then train() under sync-debug "error": the sampling,
    the weighted loss, the optimizer step, the priority update and the logged loss never wait for
    the GPU (SB3's own DQN waits once per gradient step, in ``loss.item()``)."""
    kwargs = SMALL_DQN | dict(device="cuda", learning_starts=100)
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(cuda_graphs=graphs), **kwargs)
    model.learn(600)
    assert model.replay_buffer.gper.device.type == "cuda" and model.replay_buffer.gper.backend == "triton"
    model.train(gradient_steps=8, batch_size=64)  # the shapes below, compiled and captured
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            model.train(gradient_steps=8, batch_size=64)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert math.isfinite(float(model.logger.name_to_value["train/loss"]))
    stats = model.replay_buffer.gper.stats()
    assert stats["invalid_indices"] == 0 and stats["nonfinite_td"] == 0


@pytest.mark.gpu
def test_a_buffer_saved_on_cuda_loads_into_a_cpu_model(tmp_path):
    """Pickled from CUDA (its state goes through the host), loaded by a CPU model: SB3 assigns the
    model's device and the buffer moves there, drawing what the CUDA one draws."""
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", **(SMALL_DQN | dict(device="cuda", learning_starts=10**6)))
    model.learn(300)  # collect only: equal priorities, so both back ends draw exactly the same slots
    model.save_replay_buffer(tmp_path / "rb.pkl")
    cpu = PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=TORCH, **SMALL_DQN)
    cpu.load_replay_buffer(tmp_path / "rb.pkl")
    assert cpu.replay_buffer.device.type == "cpu" and cpu.replay_buffer.gper.device.type == "cpu"
    a, b = model.replay_buffer.sample(256), cpu.replay_buffer.sample(256)
    for x, y in zip(a[:8], b[:8], strict=True):
        assert (x is None and y is None) or torch.equal(x.cpu(), y)

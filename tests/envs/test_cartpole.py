"""CartPole in PyTorch against Gymnasium's own ``CartPole-v1``, step by step from the same states."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gper.envs.cartpole import MAX_STEPS, THETA_THRESHOLD, X_THRESHOLD, CartPole

gym = pytest.importorskip("gymnasium")


def gym_env_at(state: np.ndarray):
    """Gymnasium's CartPole-v1 (with its TimeLimit) just reset, then put in float64 ``state``."""
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    env.unwrapped.state = np.array(state, dtype=np.float64)
    return env


def start_states(n: int, rng: np.random.Generator) -> np.ndarray:
    """Random states over the whole non-terminal box, plus some on or just inside the thresholds."""
    high = np.array([X_THRESHOLD, 2.0, THETA_THRESHOLD, 2.0])
    states = rng.uniform(-high, high, size=(n, 4))
    edge = [
        [X_THRESHOLD, 0.0, 0.0, 0.0],  # on the edge, not moving: x > 2.4 stays false
        [-X_THRESHOLD, 0.0, 0.0, 0.0],
        [X_THRESHOLD - 1e-9, 1e-3, 0.0, 0.0],  # crosses the edge in the first step
        [0.0, 0.0, THETA_THRESHOLD, 0.0],
        [0.0, 0.0, -THETA_THRESHOLD, 0.0],
        [0.0, 0.0, THETA_THRESHOLD - 1e-12, 1e-6],
        [0.0, 0.0, -THETA_THRESHOLD + 1e-12, -1e-6],
    ]
    states[: len(edge)] = edge
    return states


def test_matches_gymnasium_over_whole_episodes():
    """256 episodes at once with random actions: every step's obs (bit for bit), reward and flags agree."""
    rng = np.random.default_rng(0)
    n = 256
    starts = start_states(n, rng)
    refs = [gym_env_at(s) for s in starts]
    env = CartPole(n, "cpu", seed=1)
    env.set_state(torch.from_numpy(starts))
    live = np.ones(n, dtype=bool)
    compared = 0
    while live.any():
        actions = rng.integers(0, 2, size=n)
        step = env.step(torch.from_numpy(actions))
        for i in np.flatnonzero(live):
            obs, reward, terminated, truncated, _ = refs[i].step(int(actions[i]))
            assert np.array_equal(step.next_obs[i].numpy(), obs), (i, step.next_obs[i].numpy(), obs)
            assert step.reward[i].item() == reward == 1.0
            assert (bool(step.terminated[i]), bool(step.truncated[i])) == (terminated, truncated), i
            live[i] = not (terminated or truncated)
            compared += 1
    assert compared > 2 * n  # some episodes ran for a while
    assert step.next_obs.dtype == torch.float32 and step.reward.dtype == torch.float32


def balance(obs: np.ndarray) -> int:
    """A controller that keeps the pole up for 500 steps from a centred start."""
    x, x_dot, theta, theta_dot = obs
    return int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)


def test_truncates_at_exactly_500_steps_like_gymnasium():
    """A balanced episode: same step result as Gymnasium from Gymnasium's state, truncated at step 500.

    The state is re-synchronised every step because a long open-loop-unstable trajectory amplifies
    the one-ulp differences between PyTorch's and glibc's sin/cos (see the module docstring).
    """
    ref = gym_env_at(np.array([0.01, 0.0, 0.01, 0.0]))
    env = CartPole(1, "cpu")
    env.set_state(torch.tensor([[0.01, 0.0, 0.01, 0.0]], dtype=torch.float64))
    obs = np.array(ref.unwrapped.state, dtype=np.float32)
    for t in range(1, MAX_STEPS + 1):
        env.set_state(torch.from_numpy(np.array(ref.unwrapped.state)).view(1, 4), env.steps.clone())
        a = balance(obs)
        obs, _, terminated, truncated, _ = ref.step(a)
        step = env.step(torch.tensor([a]))
        assert np.array_equal(step.next_obs[0].numpy(), obs)
        assert not terminated and not bool(step.terminated[0])
        assert bool(step.truncated[0]) == truncated == (t == MAX_STEPS), t
    assert env.steps.item() == 0


def test_auto_reset_in_a_mixed_batch():
    """Terminated, truncated and running copies side by side: next_obs is the last obs, obs the new episode's."""
    env = CartPole(4, "cpu", seed=3)
    states = torch.tensor(
        [
            [X_THRESHOLD - 1e-4, 1.0, 0.0, 0.0],  # runs off the track: terminated
            [0.0, 0.0, 0.0, 0.0],  # its 500th step: truncated
            [0.0, 0.0, THETA_THRESHOLD, 1.0],  # falls at step 500: both
            [0.1, 0.2, 0.03, -0.1],  # keeps going
        ],
        dtype=torch.float64,
    )
    steps = torch.tensor([10, MAX_STEPS - 1, MAX_STEPS - 1, 7])
    env.set_state(states, steps)
    step = env.step(torch.tensor([1, 0, 1, 0]))
    assert step.terminated.tolist() == [True, False, True, False]
    assert step.truncated.tolist() == [False, True, True, False]
    ended = torch.tensor([True, True, True, False])
    assert step.next_obs[0, 0] > X_THRESHOLD and step.next_obs[2, 2] > THETA_THRESHOLD
    assert (step.obs[ended].abs() <= 0.05).all()
    assert not torch.equal(step.obs[ended], step.next_obs[ended])
    assert torch.equal(step.obs[3], step.next_obs[3])
    assert torch.equal(step.obs, env.state.float())
    assert env.steps.tolist() == [0, 0, 0, 8]


def test_reset_states_are_uniform_in_the_gymnasium_box():
    env = CartPole(4096, "cpu", seed=0)
    obs = env.reset()
    assert obs.shape == (4096, 4) and obs.dtype == torch.float32
    assert (obs.abs() <= 0.05).all() and obs.abs().amax() > 0.049
    assert abs(obs.double().mean().item()) < 2e-3
    assert env.steps.eq(0).all()


def test_seeding_and_generators():
    a, b = CartPole(8, "cpu", seed=5), CartPole(8, "cpu", seed=5)
    assert torch.equal(a.state, b.state)
    assert not torch.equal(a.state, CartPole(8, "cpu", seed=6).state)
    first = a.reset(seed=11)
    a.reset()
    assert torch.equal(a.reset(seed=11), first)
    # A caller's generator is used as is; graph_safe_rng draws from torch's default generator.
    g = torch.Generator().manual_seed(2)
    c = CartPole(8, "cpu", generator=g)
    assert c.generator is g
    torch.manual_seed(9)
    d = CartPole(8, "cpu", seed=123, graph_safe_rng=True)
    assert d.generator is None
    first = d.state.clone()
    torch.manual_seed(9)
    assert torch.equal(d.reset(seed=456), first.float())  # seeds are the caller's business here
    with pytest.raises(ValueError, match="not both"):
        CartPole(2, "cpu", generator=g, graph_safe_rng=True)


def test_state_dict_resumes_identically():
    env = CartPole(16, "cpu", seed=4)
    rng = np.random.default_rng(0)
    for _ in range(30):
        env.step(torch.from_numpy(rng.integers(0, 2, 16)))
    saved = env.state_dict()
    actions = [torch.from_numpy(rng.integers(0, 2, 16)) for _ in range(40)]
    first = [env.step(a) for a in actions]
    env.load_state_dict(saved)
    for a, want in zip(actions, first, strict=True):
        got = env.step(a)
        for x, y in zip(got, want, strict=True):
            assert torch.equal(x, y)


def test_actions_are_checked_on_the_host():
    env = CartPole(3, "cpu")
    with pytest.raises(ValueError, match="int64"):
        env.step(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[3\]"):
        env.step(torch.zeros(2, dtype=torch.int64))


def test_runs_on_any_device(device):
    env = CartPole(32, device, seed=0)
    for _ in range(600):
        step = env.step(torch.randint(0, 2, (32,), device=device))
    for t in step:
        assert t.device.type == device.type and t.shape[0] == 32
    assert (env.steps < MAX_STEPS).all()


def _triton_runs_on(device: torch.device) -> bool:
    from gper._triton import HAS_TRITON
    from helpers import TRITON_ON_CPU

    return HAS_TRITON if device.type == "cuda" else TRITON_ON_CPU


def test_the_step_kernel_computes_the_torch_steps(device):
    """The one-kernel step (backend="triton") against the torch ops, step by step from the same
    states and draws: flags, step counts and resets exactly, states to the last bits (NumPy's and
    PyTorch's sin and cos may round apart on the CPU), across terminations and the time limit."""
    if not _triton_runs_on(device):
        pytest.skip("the step kernel needs Triton (on CPU tensors, TRITON_INTERPRET=1)")
    n = 300
    ops = CartPole(n, device, generator=torch.Generator(device).manual_seed(7), backend="torch")
    fused = CartPole(n, device, generator=torch.Generator(device).manual_seed(7), backend="triton")
    assert (ops.backend, fused.backend) == ("torch", "triton")
    states = torch.as_tensor(start_states(n, np.random.default_rng(3)), device=device)
    steps = torch.randint(0, MAX_STEPS, (n,), device=device)
    steps[:50] = MAX_STEPS - 1  # these truncate in the first step
    actions = torch.Generator(device).manual_seed(11)
    ends = 0
    for _ in range(40):
        ops.set_state(states, steps)
        fused.set_state(states, steps)
        action = torch.randint(0, 2, (n,), device=device, generator=actions)
        a, b = ops.step(action), fused.step(action)
        for name in ("terminated", "truncated"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(a.reward, b.reward) and b.reward.dtype == torch.float32
        assert torch.equal(ops.steps, fused.steps)
        for x, y in ((a.next_obs, b.next_obs), (a.obs, b.obs), (ops.state, fused.state)):
            assert x.dtype == y.dtype and x.shape == y.shape
            torch.testing.assert_close(y, x, rtol=1e-6 if x.dtype == torch.float32 else 1e-13, atol=1e-12)
        ends += int((a.terminated | a.truncated).sum())
        states, steps = ops.state.clone(), ops.steps.clone()
    assert ends > 100  # the resets were exercised


def test_the_step_kernel_reads_strided_actions(device):
    """Actions as a column of a wider tensor (a strided view): the kernel steps what the ops step."""
    if not _triton_runs_on(device):
        pytest.skip("the step kernel needs Triton (on CPU tensors, TRITON_INTERPRET=1)")
    envs = [
        CartPole(8, device, generator=torch.Generator(device).manual_seed(1), backend=b) for b in ("torch", "triton")
    ]
    wide = torch.tensor([[0, 1], [1, 0]] * 4, device=device)
    for _ in range(5):
        steps = [env.step(wide[:, 1]) for env in envs]
        assert torch.equal(steps[0].terminated, steps[1].terminated)
        torch.testing.assert_close(envs[1].state, envs[0].state, rtol=1e-13, atol=1e-15)


def test_the_step_kernel_is_exact_on_cuda():
    """On CUDA the kernel and the torch ops call the same sin and cos and round every operation
    alike: whole runs from one seed agree bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    runs = []
    for backend in ("torch", "triton"):
        env = CartPole(512, "cuda", seed=5, backend=backend)
        actions = torch.Generator("cuda").manual_seed(1)
        out = []
        for _ in range(700):
            step = env.step(torch.randint(0, 2, (512,), device="cuda", generator=actions))
            out.append(torch.cat([step.next_obs, step.obs, step.terminated[:, None], step.truncated[:, None]], 1))
        runs.append(torch.stack(out))
    assert torch.equal(runs[0], runs[1])


test_the_step_kernel_is_exact_on_cuda = pytest.mark.gpu(test_the_step_kernel_is_exact_on_cuda)


def test_backend_is_checked():
    with pytest.raises(ValueError, match="backend must be"):
        CartPole(2, "cpu", backend="cuda")
    assert CartPole(2, "cpu").backend == "torch"  # auto: the kernel on CUDA only

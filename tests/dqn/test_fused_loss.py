"""The one-kernel DQN loss (:func:`gper.dqn.fused_loss.td_loss`): the Triton kernels (under the
interpreter here) against the torch reference, which is the trainer's own expression."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gper.dqn.fused_loss import td_loss
from helpers import TRITON_ON_CPU

pytestmark = pytest.mark.skipif(not TRITON_ON_CPU, reason="the Triton kernels need TRITON_INTERPRET=1 on the CPU")

# float32 throughout; the kernel sums a block's rows in another order than torch's mean (a few ulp)
TOL = dict(atol=1e-6, rtol=1e-5)


def _inputs(b: int, a: int, seed: int, flat: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    discount = (torch.rand(b, generator=g) < 0.3).float() if flat else torch.rand(b, generator=g)
    return dict(
        q=torch.randn(b, a, generator=g).requires_grad_(),
        q_next_online=torch.randn(b, a, generator=g),
        q_next_target=torch.randn(b, a, generator=g),
        action=torch.randint(0, a, (b,), generator=g),
        reward=torch.randn(b, generator=g),
        discount=discount,
        weights=torch.rand(b, generator=g) + 0.25,
    )


def _run(backend: str, inputs: dict, double_q: bool, gamma: float | None, scale: float = 1.0, loss: str = "huber"):
    """(loss, td, dq, sums) of one call and a backward of ``scale * loss``."""
    q = inputs["q"].detach().clone().requires_grad_()
    args = dict(inputs, q=q, q_next_online=inputs["q_next_online"] if double_q else None)
    sums = torch.full((3,), 0.5, dtype=torch.float64)
    loss, td = td_loss(**args, gamma=gamma, sums=sums, backend=backend, loss=loss)
    (scale * loss).backward()
    return loss.detach(), td, q.grad, sums


@pytest.mark.parametrize("b, a", [(1, 2), (33, 45), (130, 7)])
@pytest.mark.parametrize("double_q", [True, False])
@pytest.mark.parametrize("gamma", [0.99, None], ids=["flat", "trajectory"])
@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_kernels_match_the_reference(b, a, double_q, gamma, loss):
    inputs = _inputs(b, a, seed=b + a, flat=gamma is not None)
    got = _run("triton", inputs, double_q, gamma, loss=loss)
    want = _run("torch", inputs, double_q, gamma, loss=loss)
    for g, w, name in zip(got, want, ("loss", "td", "dq", "sums"), strict=True):
        torch.testing.assert_close(g, w, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_the_reference_is_the_trainers_expression():
    """double-Q target from the done flags, Huber (delta 1) x IS weights, mean; td = q[a] - y."""
    x = _inputs(40, 5, seed=3, flat=True)
    q = x["q"].gather(1, x["action"].unsqueeze(1)).squeeze(1)
    next_q = x["q_next_target"].gather(1, x["q_next_online"].argmax(1, keepdim=True)).squeeze(1)
    y = x["reward"] + 0.9 * (1.0 - x["discount"]) * next_q
    loss = (F.huber_loss(q, y, reduction="none", delta=1.0) * x["weights"]).mean()
    got, td = td_loss(**x, gamma=0.9, backend="torch")
    assert torch.equal(got, loss) and torch.equal(td, (q - y).detach())


def test_the_squared_error_reference_is_pure_jax_rls_expression():
    """loss="mse": the max-Q target from the done flags, mean((q[a] - y)^2 * w) with no 1/2, written
    out element by element; its gradient 2 (q[a] - y) w / B at the action."""
    x = _inputs(12, 3, seed=4, flat=True)
    got, td, dq, _ = _run("torch", x, double_q=False, gamma=0.9, loss="mse")
    want, grad = 0.0, torch.zeros(12, 3)
    for i in range(12):
        a = int(x["action"][i])
        y = float(x["reward"][i]) + 0.9 * (1.0 - float(x["discount"][i])) * float(x["q_next_target"][i].max())
        d = float(x["q"][i, a].detach()) - y
        want += d * d * float(x["weights"][i]) / 12
        grad[i, a] = 2.0 * d * float(x["weights"][i]) / 12
    torch.testing.assert_close(got, torch.tensor(want), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(dq, grad, atol=1e-6, rtol=1e-5)
    kernel = _run("triton", x, double_q=False, gamma=0.9, loss="mse")
    torch.testing.assert_close(kernel[0], got, **TOL)
    torch.testing.assert_close(kernel[2], dq, **TOL)
    assert not torch.allclose(got, _run("torch", x, double_q=False, gamma=0.9)[0])  # not Huber's


def test_edge_cases_td_of_exactly_one_zero_weights_zero_discount():
    # dyadic values: q[a] - y is exactly +-1, +-0.5, +-2, and 0 where the discount is 0
    b, a = 8, 3
    action = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    reward = torch.tensor([0.0, 1.0, -1.0, 0.5, 2.0, 0.0, -0.25, 1.0])
    target_q = torch.zeros(b, a)
    delta = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.0, 1.0])
    q = torch.zeros(b, a)
    q[torch.arange(b), action] = reward + delta
    x = dict(
        q=q.requires_grad_(),
        q_next_online=torch.zeros(b, a),  # all ties: argmax 0 in both
        q_next_target=target_q,
        action=action,
        reward=reward,
        discount=torch.tensor([0.0, 0.5, 0.0, 1.0, 0.0, 0.25, 0.0, 0.0]),
        weights=torch.tensor([1.0, 0.0, 1.0, 2.0, 0.0, 1.0, 1.0, 0.5]),
    )
    loss, td, dq, _ = _run("triton", x, double_q=True, gamma=None, scale=3.0)
    assert torch.equal(td, delta)
    huber = torch.where(delta.abs() < 1, 0.5 * delta**2, delta.abs() - 0.5)
    torch.testing.assert_close(loss, (huber * x["weights"]).mean(), atol=0, rtol=1e-6)
    want = torch.zeros(b, a)
    want[torch.arange(b), action] = delta.clamp(-1, 1) * x["weights"] * 3.0 / b
    torch.testing.assert_close(dq, want, atol=0, rtol=1e-6)
    assert torch.isfinite(dq).all() and (dq[x["weights"] == 0] == 0).all()
    ref = _run("torch", x, double_q=True, gamma=None, scale=3.0)
    torch.testing.assert_close(dq, ref[2], atol=0, rtol=1e-6)


def test_gradient_matches_finite_differences():
    """Huber is quadratic on each side of |td| = 1: central differences away from the kinks are exact
    up to float32 rounding."""
    x = _inputs(16, 4, seed=7, flat=True)
    _, td, dq, _ = _run("triton", x, double_q=True, gamma=0.99)
    h = 1e-2
    rows = [i for i in range(16) if abs(abs(td[i].item()) - 1) > 2 * h][:6]
    assert len(rows) >= 4
    for i in rows:
        j = x["action"][i].item()
        for k in (j, (j + 1) % 4):
            plus, minus = x["q"].detach().clone(), x["q"].detach().clone()
            plus[i, k] += h
            minus[i, k] -= h
            lp = td_loss(**dict(x, q=plus), gamma=0.99, backend="triton")[0]
            lm = td_loss(**dict(x, q=minus), gamma=0.99, backend="triton")[0]
            torch.testing.assert_close((lp - lm) / (2 * h), dq[i, k], atol=2e-5, rtol=1e-3)


def test_strided_inputs_and_bf16_q():
    """The 1-D fields as strided views of packed rows (as a sampled batch holds them), and bf16 Q-values
    (autocast): the gradient comes back in q's dtype."""
    x = _inputs(50, 6, seed=9, flat=True)
    rows = torch.stack([x["reward"], x["discount"], x["weights"], torch.zeros(50)], 1)
    strided = dict(x, reward=rows[:, 0], discount=rows[:, 1], weights=rows[:, 2])
    assert strided["reward"].stride() == (4,)
    got, want = _run("triton", strided, True, 0.99), _run("torch", x, True, 0.99)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **TOL)
    q16 = x["q"].detach().bfloat16().requires_grad_()
    loss, td = td_loss(**dict(x, q=q16), gamma=0.99, backend="triton")
    loss.backward()
    ref_loss, ref_td = td_loss(**dict(x, q=q16.detach().float()), gamma=0.99, backend="torch")
    assert q16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, ref_loss.detach(), **TOL)
    torch.testing.assert_close(td, ref_td, **TOL)


def test_bad_inputs_are_refused_in_one_line():
    x = _inputs(10, 3, seed=1, flat=True)
    with pytest.raises(ValueError, match="action must be \\[10\\] torch.int64"):
        td_loss(**dict(x, action=x["action"].int()), gamma=0.99, backend="triton")
    with pytest.raises(ValueError, match="q_next_online must be"):
        td_loss(**dict(x, q_next_online=torch.zeros(10, 4)), gamma=0.99, backend="triton")
    with pytest.raises(ValueError, match="sums must be"):
        td_loss(**x, gamma=0.99, sums=torch.zeros(3), backend="triton")
    with pytest.raises(ValueError, match="loss must be one of"):
        td_loss(**x, gamma=0.99, backend="torch", loss="l1")
    with pytest.raises(ValueError, match="backend"):
        td_loss(**x, gamma=0.99, backend="cuda")

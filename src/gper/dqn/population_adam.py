"""Adam over a population's stacked parameters, and its target-network updates.

Adam is elementwise, so one Adam over tensors stacked ``[N, ...]`` is N independent Adams as long
as the agents share their settings; :class:`PopulationAdam` also takes one learning rate per
agent (a sweep), broadcast over each tensor's leading dim. Its update is ``torch.optim.Adam``'s
(bias-corrected, no weight decay, no amsgrad) as the single agent builds it (default betas and
eps; on the CPU neither foreach, fused nor capturable, so the single-tensor path), in the same
elementwise ops, so on the CPU agent ``i``'s parameters and moments are bit for bit the single
agent's. Each tensor's update is a few whole-tensor ops whatever N is (on CUDA a few launches per
tensor); ``capturable=True`` keeps the step counts on the device and reads nothing back (the
formula of ``torch.optim.Adam``'s capturable path, for CUDA graphs; not bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from gper._triton import HAS_TRITON
from gper.dqn.population_fused_adam import population_adam_step
from gper.dqn.population_net import StackedQNetwork


class PopulationAdam:
    """Adam with independent state for each agent of stacked parameters.

    Args:
        params: the stacked parameters (each [N, ...], agent along dim 0), for example
            ``list(StackedQNetwork.parameters())``; their ``.grad`` is what :meth:`step` reads.
        lr: one learning rate for all agents, or one per agent (a sequence of numbers or an [N]
            float64 tensor: a float32 one would have rounded them).
        betas, eps: Adam's settings, shared by the agents (``torch.optim.Adam``'s defaults).
        capturable: step counts on the parameters' device and bias corrections as device ops
            (no host read: a CUDA graph may capture :meth:`step`); False: step counts on the CPU
            and bias corrections as Python floats, as ``torch.optim.Adam`` on the CPU.
        reference: which single-agent update to reproduce on the CPU: ``"torch"``,
            ``torch.optim.Adam`` (the agent without ``fused_step``), or ``"fused"``,
            :func:`gper.dqn.fused_adam.adam_step`'s torch back end (the agent with ``fused_step``,
            the default). They differ in one host number only, the bias correction's square root:
            ``bc2 ** 0.5`` against ``math.sqrt(bc2)``, which differ in the last bit at some steps
            (with beta2 = 0.999 first at step 1270, then 2582, 3069, ...); the update rounds it to
            float32, so the parameters differ only where that rounding falls differently (at steps
            1268-1271 and 2580-2583 of a small network the tests saw no difference either way).
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        lr: float | Sequence[float] | torch.Tensor,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        capturable: bool = False,
        reference: str = "torch",
        backend: str = "auto",
    ) -> None:
        if reference not in ("torch", "fused"):
            raise ValueError(f"reference must be torch or fused, got {reference!r}")
        if backend not in ("auto", "torch", "triton"):
            raise ValueError(f"backend must be auto, torch or triton, got {backend!r}")
        self.reference = reference
        self.params = list(params)
        if not self.params:
            raise ValueError("PopulationAdam needs at least one parameter")
        self.n_agents = self.params[0].shape[0] if self.params[0].dim() else 0
        if any(p.dim() < 1 or p.shape[0] != self.n_agents for p in self.params):
            raise ValueError(
                "PopulationAdam needs parameters with the agents along dim 0, got "
                f"{[tuple(p.shape) for p in self.params]}"
            )
        self.lr = _per_agent(lr, self.n_agents, "lr")
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps, self.capturable = float(eps), capturable
        step_device = self.params[0].device if capturable else torch.device("cpu")
        self.steps = torch.zeros(self.n_agents, dtype=torch.float32, device=step_device)
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self._lr_device = None
        _ = self._lr_on_device
        if backend == "auto":
            backend = "triton" if HAS_TRITON and capturable and self.params[0].is_cuda else "torch"
        if backend == "triton" and not capturable:
            raise ValueError("the triton backend keeps the step counts on the device: it needs capturable=True")
        #: one kernel per tensor (:mod:`gper.dqn.population_fused_adam`), else torch ops
        self.fused = backend == "triton"

    def zero_grad(self) -> None:
        """Drop the gradients (``set_to_none``, as the single agent's ``zero_grad``)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(
        self,
        grad_scale: torch.Tensor | None = None,
        targets: Sequence[torch.Tensor] | None = None,
        tau: float | torch.Tensor = 1.0,
    ) -> None:
        """One Adam step of every agent, from the parameters' ``.grad``.

        Args:
            grad_scale: [N] float32, each agent's gradients multiplied by it first (a clipping's
                scale, :func:`gper.dqn.population_loss.clip_scales`); the torch ops scale ``.grad``
                in place, the kernel reads it scaled and leaves it.
            targets: target parameters (a :class:`StackedQNetwork`'s, in this order), moved
                towards the updated parameters: ``target.lerp_(param, tau)``, after the step.
            tau: the target rate: one float, or [N] float32 on the parameters' device.
        """
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            raise ValueError("PopulationAdam.step: a parameter has no gradient (backward first)")
        targets = None if targets is None else list(targets)
        if self.fused:
            population_adam_step(
                self.params, grads, self.exp_avgs, self.exp_avg_sqs, self.steps, self._lr_on_device,
                beta1=self.beta1, beta2=self.beta2, eps=self.eps, grad_scale=grad_scale, targets=targets, tau=tau,
            )  # fmt: skip
            return
        if grad_scale is not None:
            for g in grads:
                g.mul_(grad_scale.view((self.n_agents,) + (1,) * (g.dim() - 1)))
        self._moments_and_update(grads)
        if targets is not None:
            _lerp_targets(targets, self.params, tau, self.n_agents)

    def _moments_and_update(self, grads: list[torch.Tensor]) -> None:
        b1, b2 = self.beta1, self.beta2
        # torch.optim.Adam's single-tensor order: moments first, then the step count, then the update
        torch._foreach_lerp_(self.exp_avgs, grads, 1 - b1)
        torch._foreach_mul_(self.exp_avg_sqs, b2)
        torch._foreach_addcmul_(self.exp_avg_sqs, grads, grads, value=1 - b2)
        self.steps += 1
        if self.capturable:
            self._update_on_device()
        else:
            self._update_from_host()

    def _update_from_host(self) -> None:
        # the bias corrections as torch.optim.Adam computes them on the CPU: Python floats from the
        # step count, one per agent, then float32 where the elementwise ops use them
        step_size, bc2_sqrt = [], []
        for lr, step in zip(self.lr.tolist(), self.steps.tolist(), strict=True):
            step_size.append(-(lr / (1 - self.beta1**step)))
            bc2 = 1 - self.beta2**step
            bc2_sqrt.append(bc2**0.5 if self.reference == "torch" else math.sqrt(bc2))
        device = self.params[0].device
        neg_step = torch.tensor(step_size, dtype=torch.float64).to(device, torch.float32)
        root = torch.tensor(bc2_sqrt, dtype=torch.float64).to(device, torch.float32)
        for p, m, v in zip(self.params, self.exp_avgs, self.exp_avg_sqs, strict=True):
            shape = (self.n_agents,) + (1,) * (p.dim() - 1)
            denom = (v.sqrt() / root.view(shape)).add_(self.eps)
            # addcdiv_(m, denom, value=-step_size) computes p + (value * m) / denom: the same, with
            # the value one per agent
            p.addcdiv_(neg_step.view(shape) * m, denom)

    def _update_on_device(self) -> None:
        # torch.optim.Adam's capturable formula: the step size folded into the denominator
        lr = self._lr_on_device
        step_size_neg = -(lr / (1 - torch.pow(self.beta1, self.steps.double())))
        bc2_sqrt = (1 - torch.pow(self.beta2, self.steps.double())).sqrt()
        scale = (bc2_sqrt * step_size_neg).float()
        eps = (self.eps / step_size_neg).float()
        for p, m, v in zip(self.params, self.exp_avgs, self.exp_avg_sqs, strict=True):
            shape = (self.n_agents,) + (1,) * (p.dim() - 1)
            p.addcdiv_(m, (v.sqrt() / scale.view(shape)).add_(eps.view(shape)))

    def set_lr(self, lr: float | Sequence[float] | torch.Tensor) -> None:
        """New learning rates (one, or one per agent) for the following steps (written in place on
        the device, where a captured step reads them)."""
        self.lr = _per_agent(lr, self.n_agents, "lr")
        self._lr_on_device.copy_(self.lr)

    @property
    def device_lr(self) -> torch.Tensor:
        """The [N] float64 learning rates on the step counts' device (what a captured step reads)."""
        return self._lr_on_device

    @property
    def _lr_on_device(self) -> torch.Tensor:
        # made once, outside any capture: a host-to-device copy may not run inside a CUDA graph capture
        if getattr(self, "_lr_device", None) is None:
            self._lr_device = self.lr.to(self.steps.device)
        return self._lr_device

    def agent_state(self, i: int) -> list[dict[str, torch.Tensor]]:
        """Agent ``i``'s state per parameter as ``torch.optim.Adam.state`` holds it for its
        network (``step``, ``exp_avg``, ``exp_avg_sq``; copies), in the parameters' order."""
        if not 0 <= i < self.n_agents:
            raise IndexError(f"agent index {i} is out of range for a population of {self.n_agents}")
        return [
            {"step": self.steps[i].clone(), "exp_avg": m[i].clone(), "exp_avg_sq": v[i].clone()}
            for m, v in zip(self.exp_avgs, self.exp_avg_sqs, strict=True)
        ]


def hard_update_(target: StackedQNetwork, online: StackedQNetwork) -> None:
    """Copy every agent's online parameters into its target (the single agent's ``sync_target``)."""
    _check_pair(target, online)
    with torch.no_grad():
        torch._foreach_copy_(list(target.parameters()), list(online.parameters()))


def soft_update_(target: StackedQNetwork, online: StackedQNetwork, tau: float | Sequence[float] | torch.Tensor) -> None:
    """Move every agent's target towards its online parameters: ``target.lerp_(online, tau)``.

    ``tau`` is one rate (the single agent's ``_foreach_lerp_``, bit for bit) or one per agent,
    broadcast over each tensor's leading dim."""
    _check_pair(target, online)
    targets, onlines = list(target.parameters()), list(online.parameters())
    if not isinstance(tau, (int, float)):
        tau = _per_agent(tau, target.n_agents, "tau").to(targets[0].device, torch.float32)
    _lerp_targets(targets, onlines, tau, target.n_agents)


@torch.no_grad()
def _lerp_targets(
    targets: list[torch.Tensor], onlines: list[torch.Tensor], tau: float | torch.Tensor, n_agents: int
) -> None:
    """``target.lerp_(online, tau)`` for every tensor: one float (the single agent's
    ``_foreach_lerp_``, bit for bit) or [N] float32 rates, broadcast over each tensor's leading dim."""
    if isinstance(tau, (int, float)):
        torch._foreach_lerp_(targets, onlines, float(tau))
        return
    for t, p in zip(targets, onlines, strict=True):
        t.lerp_(p, tau.view((n_agents,) + (1,) * (t.dim() - 1)))


def _check_pair(target: StackedQNetwork, online: StackedQNetwork) -> None:
    shapes = [tuple(p.shape) for p in target.parameters()], [tuple(p.shape) for p in online.parameters()]
    if shapes[0] != shapes[1]:
        raise ValueError(f"target and online populations differ: {shapes[0]} and {shapes[1]}")


def _per_agent(value: float | Sequence[float] | torch.Tensor, n: int, name: str) -> torch.Tensor:
    """``value`` as an [n] float64 CPU tensor: one number repeated, or one per agent."""
    if isinstance(value, (int, float)):
        value = [float(value)] * n
    elif isinstance(value, torch.Tensor) and value.dtype != torch.float64:
        # a float32 tensor has rounded the rates: the agents would not train at the rates asked for
        raise ValueError(f"{name} as a tensor must be float64 (or pass a list of numbers), got {value.dtype}")
    t = torch.as_tensor(value, dtype=torch.float64).detach().cpu().flatten()
    if t.shape != (n,) or not torch.isfinite(t).all() or (t <= 0).any():
        raise ValueError(f"{name} must be one number > 0 or {n} of them (one per agent), got {tuple(t.shape)} values")
    return t

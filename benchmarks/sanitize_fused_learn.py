"""A few steps of the population's fused learn kernels at several shapes, for compute-sanitizer
(``compute-sanitizer --tool memcheck python benchmarks/sanitize_fused_learn.py``): every access in
bounds, at batches that are and are not whole chunks, widths padded and not."""

from __future__ import annotations

import torch

from gper.dqn.population_adam import PopulationAdam
from gper.dqn.population_fused_learn import population_learn_step
from gper.dqn.population_net import stacked_init


def main() -> None:
    device = torch.device("cuda")
    for n, batch, hidden, n_in, n_act in (
        (3, 45, (24, 20), 4, 2),
        (2, 256, (128, 128), 16, 16),
        (5, 128, (120, 84), 4, 2),
    ):
        online = stacked_init(list(range(n)), n_in, n_act, hidden, device=device)
        target = online.detached_copy()
        adam = PopulationAdam(list(online.parameters()), lr=1e-3, capturable=True, backend="triton")
        rows = torch.randn(n, batch, 2, n_in + 3, device=device)
        x, nx = rows[:, :, 0, :n_in], rows[:, :, 1, :n_in]
        action = torch.randint(0, n_act, (n, batch), device=device)
        reward, done = torch.randn(n, batch, device=device), (torch.rand(n, batch, device=device) < 0.1).float()
        weights, td = torch.rand(n, batch, device=device), torch.zeros(n, batch, device=device)
        sums = torch.zeros(n, 3, dtype=torch.float64, device=device)
        for soft in (None, 0.1):
            for _ in range(2):
                population_learn_step(
                    list(online.parameters()), list(target.parameters()), adam.exp_avgs, adam.exp_avg_sqs,
                    adam.steps, adam.device_lr, x, nx, action, reward, done, weights, sums, td,
                    gamma=0.99, double_q=soft is None, max_grad_norm=1.0, soft_tau=soft, precision="tf32",
                )  # fmt: skip
        torch.cuda.synchronize()
        assert torch.isfinite(sums).all() and torch.isfinite(td).all()
        print(f"n={n} batch={batch} hidden={hidden}: ok", flush=True)


if __name__ == "__main__":
    main()

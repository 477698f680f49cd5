"""Where the DQN learning step's time goes: variants of the fixed-batch step, each as one CUDA graph,
and the kernels of one eager step from the profiler.

The step is the trainer's (double-Q targets, Huber x IS weights, fused capturable Adam) on the
51 -> 512 -> 512 -> 45 network at batch 16384, fed from a fixed batch; each variant changes one
thing. The last row of each precision is the trainer's own learn step (:class:`gper.dqn.Agent`,
the market preset) fed the same way, through its public batch source (:class:`gper.dqn.FixedBatch`).
Prints a table and writes ``benchmarks/results/train-step-variants-<gpu>-<stamp>.md``.

    python benchmarks/train_step_variants.py
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gper.bench.report import environment, format_markdown, header_line, print_table
from gper.bench.timing import capture_graph, time_fn


def mlp(sizes: list[int], inplace: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, o in zip(sizes, sizes[1:], strict=False):
        layers += [nn.Linear(i, o), nn.ReLU(inplace=inplace)]
    return nn.Sequential(*layers[:-1])


def make_step(batch: int, obs_dim: int, variant: dict, device: torch.device):
    """A closure running one learning step, and the tensors it needs kept alive."""
    pad = variant.get("pad", obs_dim)
    net = mlp([pad, 512, 512, 45], variant.get("inplace", False)).to(device)
    target = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, capturable=True, fused=variant.get("fused", True))
    g = torch.Generator(device=device).manual_seed(0)
    obs = torch.zeros(batch, pad, device=device)
    obs[:, :obs_dim] = torch.randn(batch, obs_dim, device=device, generator=g)
    next_obs = torch.zeros(batch, pad, device=device)
    next_obs[:, :obs_dim] = torch.randn(batch, obs_dim, device=device, generator=g)
    action = torch.randint(0, 45, (batch,), device=device, generator=g)
    reward = torch.randn(batch, device=device, generator=g)
    done = torch.zeros(batch, device=device)
    weights = torch.ones(batch, device=device)
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    params, tparams = list(net.parameters()), list(target.parameters())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=variant.get("bf16", False)):
            q = net(obs).float().gather(1, action.unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                nt = target(next_obs).float()
                na = net(next_obs).argmax(1, keepdim=True)
                y = reward + 0.99 * (1 - done) * nt.gather(1, na).squeeze(1)
        loss = (F.huber_loss(q, y, reduction="none") * weights).mean()
        loss.backward()
        if variant.get("stats", True):
            td = (q - y).detach()
            sums.add_(torch.stack((loss.detach(), q.detach().mean(), td.abs().mean(), torch.ones((), device=device))))
        if variant.get("clip", True):
            nn.utils.clip_grad_norm_(params, 10.0, foreach=True)
        opt.step()
        if variant.get("soft", True):
            with torch.no_grad():
                torch._foreach_lerp_(tparams, params, 0.005)

    return step


def agent_step(batch: int, obs_dim: int, precision: str, device: torch.device):
    """The trainer's learn step (market preset: no clipping, soft target update, loss sums) from a
    fixed batch, warmed up and captured; returns the function that runs one step."""
    from gper import PrioritizedReplayBuffer
    from gper.dqn import Agent, Config, FixedBatch, padded_width, replay_spec, resolve

    settings = dict(env="market", device=str(device), num_envs=1, hidden=(512, 512), precision=precision)
    cfg = resolve(Config(**settings, batch_size=batch, learning_starts=batch, buffer_size=batch), device)
    width = padded_width(obs_dim)
    g = torch.Generator(device=device).manual_seed(0)
    fixed = FixedBatch(
        {
            "obs": torch.randn(batch, width, device=device, generator=g),
            "next_obs": torch.randn(batch, width, device=device, generator=g),
            "action": torch.randint(0, 45, (batch,), device=device, generator=g),
            "reward": torch.randn(batch, device=device, generator=g),
            "done": torch.zeros(batch, device=device),
        }
    )
    rb = PrioritizedReplayBuffer(batch, replay_spec(width), device=device)  # the agent's; never drawn from
    agent = Agent.for_learning(obs_dim, 45, cfg, rb, total_train_steps=10**6, batch_source=lambda: fixed)
    for _ in range(agent.learn.warmup + 1):
        agent.learn.run()
    return agent.learn.run


VARIANTS = {
    "trainer (clip, soft target, stats)": {},
    "no grad clipping": {"clip": False},
    "no soft target update": {"soft": False},
    "no stats": {"stats": False},
    "bare (no clip/soft/stats)": {"clip": False, "soft": False, "stats": False},
    "in-place ReLU": {"inplace": True},
    "input padded to 64": {"pad": 64},
    "input padded to 52": {"pad": 52},
    "in-place ReLU + pad 64": {"inplace": True, "pad": 64},
    "foreach Adam (not fused)": {"fused": False},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--profile", action="store_true", help="also print the kernels of one eager step")
    args = p.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    env = environment(device)
    print(header_line(env, "train-step variants"))
    rows = []
    for precision in ("tf32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        for name, variant in VARIANTS.items():
            variant = dict(variant, bf16=precision == "bf16")
            step = make_step(args.batch, 51, variant, device)
            graph = capture_graph(step)
            t = time_fn(graph.replay, iters=200, repeats=5, device=device)
            rows.append([precision, name, f"{t.median_us / 1e3:.3f}", f"{t.min_us / 1e3:.3f}"])
            print(rows[-1])
            graph.reset()
            if args.profile and precision == "tf32" and name.startswith("trainer"):
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        step()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
        run = agent_step(args.batch, 51, precision, device)
        t = time_fn(run, iters=200, repeats=5, device=device)
        rows.append(
            [
                precision,
                "gper.dqn.Agent learn step (market preset)",
                f"{t.median_us / 1e3:.3f}",
                f"{t.min_us / 1e3:.3f}",
            ]
        )
        print(rows[-1])
        del run
    headers = ["precision", "variant", "ms/step (median)", "ms/step (min)"]
    print_table(headers, rows, [False, False, True, True])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"train-step-variants-{env['slug']}-{env['stamp']}.md"
    path.write_text(
        "\n".join(
            [
                "# The learning step's variants (fixed batch, one CUDA graph each)",
                "",
                header_line(env, "train-step variants"),
                "",
                f"51 -> 512 -> 512 -> 45, batch {args.batch}, 200 replays x 5 repeats.",
                "",
                format_markdown(headers, rows, [False, False, True, True]),
                "",
            ]
        )
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

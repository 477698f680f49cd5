"""Where the DQN learning step's time goes: variants of the fixed-batch step, each as one CUDA graph,
and the kernels of one eager step from the profiler.

The step is the trainer's (double-Q targets, Huber x IS weights, fused capturable Adam) on the
51 -> 512 -> 512 -> 45 network at batch 16384, fed from a fixed batch; each variant changes one
thing. The first group (both precisions) takes things away from the step; the second (TF32 only,
from the market preset's step: input padded to 52, in-place ReLU, no clipping, soft target
update, loss sums) puts fused pieces in:

- ``act``: the hidden layers as ``torch._addmm_activation`` (cuBLASLt's bias + ReLU epilogue) in
  the two no-grad forwards on the next observations (``nograd``) or in all three (``all``: the
  grad forward through :class:`gper.dqn.network.LinearReLU`);
- ``loss``: the loss, TD errors and sums as one Triton kernel (:func:`gper.dqn.fused_loss.td_loss`);
- ``fork``: the forwards on the next observations on a second stream (a parallel branch of the graph);
- ``adam``: ``triton``, Adam with the soft update in one Triton kernel per tensor
  (:func:`gper.dqn.fused_adam.adam_step`); ``flat``: parameters, gradients, moments and target
  as views of flat buffers, so Adam and the soft update are one launch (gradients accumulate
  into the zeroed flat buffer);
- ``compile``: ``torch.compile`` (fullgraph) of the forwards and the loss, compiled and warmed
  before the capture.

The last rows of each precision are the trainer's own learn step (:class:`gper.dqn.Agent`, the
market preset), fed the same way through its public batch source (:class:`gper.dqn.FixedBatch`),
without and with ``fused_step``. On its first (eager) step every variant's loss, TD errors,
gradients and updated parameters are compared with those of the group's base (the same
initial network and batch); the table shows the largest differences, relative to the base's
largest magnitude. Prints the table and writes ``benchmarks/results/train-step-variants-<gpu>-<stamp>.{csv,md}``.

    python benchmarks/train_step_variants.py                   # all variants, about 3 minutes on an H200
    python benchmarks/train_step_variants.py --only fused      # the variants whose name holds "fused"
    python benchmarks/train_step_variants.py --no-compile      # without the torch.compile variants
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gper.bench.report import ResultFiles, environment, format_markdown, header_line, print_table
from gper.bench.timing import capture_graph, time_fn
from gper.dqn.fused_adam import adam_state, adam_step
from gper.dqn.fused_loss import td_loss
from gper.dqn.network import linear_relu

GAMMA, TAU, LR, CLIP = 0.99, 0.005, 1e-4, 10.0


def mlp(sizes: list[int], inplace: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, o in zip(sizes, sizes[1:], strict=False):
        layers += [nn.Linear(i, o), nn.ReLU(inplace=inplace)]
    return nn.Sequential(*layers[:-1])


def fused_forward(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``net(x)`` with each Linear + ReLU as one ``_addmm_activation`` (see QNetwork.fused_forward)."""
    layers = list(net)
    for i in range(0, len(layers), 2):
        lin = layers[i]
        x = linear_relu(x, lin.weight, lin.bias) if i + 1 < len(layers) else F.linear(x, lin.weight, lin.bias)
    return x


def flatten(params: list[nn.Parameter], device: torch.device) -> torch.Tensor:
    """One flat buffer holding ``params``, which become views of it."""
    flat = torch.empty(sum(p.numel() for p in params), device=device)
    offset = 0
    for p in params:
        view = flat[offset : offset + p.numel()].view_as(p)
        view.copy_(p.detach())
        p.data = view
        offset += p.numel()
    return flat


def make_step(batch: int, obs_dim: int, variant: dict, device: torch.device):
    """A closure ``step(probe=None)`` running one learning step; with a dict ``probe`` it also
    stores the step's loss, TD errors, gradients (before clipping) and updated parameters there."""
    pad = variant.get("pad", obs_dim)
    torch.manual_seed(0)  # every variant of one width starts from the same network
    net = mlp([pad, 512, 512, 45], variant.get("inplace", False)).to(device)
    target = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=LR, capturable=True, fused=variant.get("fused", True))
    g = torch.Generator(device=device).manual_seed(0)
    obs = torch.zeros(batch, pad, device=device)
    obs[:, :obs_dim] = torch.randn(batch, obs_dim, device=device, generator=g)
    next_obs = torch.zeros(batch, pad, device=device)
    next_obs[:, :obs_dim] = torch.randn(batch, obs_dim, device=device, generator=g)
    action = torch.randint(0, 45, (batch,), device=device, generator=g)
    reward = torch.randn(batch, device=device, generator=g)
    done = (torch.rand(batch, device=device, generator=g) < 0.1).float()
    weights = torch.rand(batch, device=device, generator=g) + 0.5
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    params, tparams = list(net.parameters()), list(target.parameters())
    act, adam = variant.get("act"), variant.get("adam", "fused")
    clip, soft, stats = variant.get("clip", True), variant.get("soft", True), variant.get("stats", True)
    side = torch.cuda.Stream(device) if variant.get("fork") else None
    flat = None
    if adam == "flat":
        flat = dict(p=flatten(params, device), t=flatten(tparams, device))
        flat |= dict(g=torch.zeros_like(flat["p"]), m=torch.zeros_like(flat["p"]), v=torch.zeros_like(flat["p"]))
        flat["step"] = torch.zeros((), device=device)
        offset = 0
        for p in params:  # gradients accumulate into views of one zeroed buffer
            p.grad = flat["g"][offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def online(x):
        return fused_forward(net, x) if act == "all" else net(x)

    def next_forwards():
        if act in ("all", "nograd"):
            return fused_forward(target, next_obs), fused_forward(net, next_obs)
        return target(next_obs), net(next_obs)

    def plain_loss(q_all, nt, no):
        q = q_all.float().gather(1, action.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            y = reward + GAMMA * (1 - done) * nt.float().gather(1, no.argmax(1, keepdim=True)).squeeze(1)
        loss = (F.huber_loss(q, y, reduction="none") * weights).mean()
        td = (q - y).detach()
        if stats:
            sums.add_(torch.stack((loss.detach(), q.detach().mean(), td.abs().mean())))
        return loss, td

    def forward_loss():
        q_all = online(obs)
        with torch.no_grad():
            nt, no = next_forwards()
        return plain_loss(q_all, nt, no)

    compiled = None
    if variant.get("compile"):
        compiled = torch.compile(forward_loss, fullgraph=True, mode=variant["compile"])

    def step(probe: dict | None = None) -> None:
        if probe is not None:
            probe.update(
                params_before=[p.detach().clone() for p in params], targets_before=[t.clone() for t in tparams]
            )
        if flat is not None:
            flat["g"].zero_()
        else:
            opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=variant.get("bf16", False)):
            if compiled is not None:
                loss, td = compiled()
            else:
                if side is not None:
                    main = torch.cuda.current_stream(device)
                    side.wait_stream(main)
                    with torch.cuda.stream(side), torch.no_grad():
                        nt, no = next_forwards()
                    q_all = online(obs)
                    main.wait_stream(side)
                else:
                    q_all = online(obs)
                    with torch.no_grad():
                        nt, no = next_forwards()
                if variant.get("loss") == "fused":
                    loss, td = td_loss(
                        q_all, no, nt, action, reward, done, weights, gamma=GAMMA, sums=sums if stats else None
                    )
                else:
                    loss, td = plain_loss(q_all, nt, no)
        loss.backward()
        if probe is not None:
            probe.update(loss=loss.detach().clone(), td=td.clone(), grads=[p.grad.clone() for p in params])
        if clip:
            nn.utils.clip_grad_norm_(params, CLIP, foreach=True)
        if adam == "fused":
            opt.step()
            if soft:
                with torch.no_grad():
                    torch._foreach_lerp_(tparams, params, TAU)
        elif adam == "triton":
            p_, m_, v_, s_ = adam_state(opt)
            adam_step(
                p_, [p.grad for p in p_], m_, v_, s_, lr=LR, beta1=0.9, beta2=0.999, eps=1e-8,
                targets=tparams if soft else None, tau=TAU,
            )  # fmt: skip
        else:  # flat: one launch for every tensor
            adam_step(
                [flat["p"]], [flat["g"]], [flat["m"]], [flat["v"]], [flat["step"]], lr=LR, beta1=0.9, beta2=0.999,
                eps=1e-8, targets=[flat["t"]] if soft else None, tau=TAU,
            )  # fmt: skip
        if probe is not None:
            probe.update(params=[p.detach().clone() for p in params], targets=[t.clone() for t in tparams])

    return step


def differences(probe: dict, base: dict, same_update: bool) -> dict[str, float]:
    """Largest differences from the base's probe, each relative to the base's largest magnitude.

    The step's (the parameters' and the target's change) only where the gradients are the base's
    bit for bit and clipping and the target update are too: Adam's first step moves each weight
    by about lr * sign(grad), so gradients that differ in their rounding would flip the moves of
    the weights whose gradient is near 0, and the figure would say nothing about Adam."""

    def rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        scale = max(t.abs().max().item() for t in b) or 1.0
        return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b, strict=True)) / scale

    out = {
        "loss": rel([probe["loss"]], [base["loss"]]),
        "td": rel([probe["td"]], [base["td"]]),
        "grads": rel(probe["grads"], base["grads"]),
    }
    if same_update and out["grads"] == 0:

        def moves(pr: dict, key: str) -> list[torch.Tensor]:
            return [a - b for a, b in zip(pr[key], pr[key + "_before"], strict=True)]

        out["step"] = rel(moves(probe, "params"), moves(base, "params"))
        # the target moves by tau * lr: float32 rounding of weights near 0.1 alone is a few percent of that
        out["target"] = rel(moves(probe, "targets"), moves(base, "targets"))
    return out


MARKET = {"pad": 52, "inplace": True, "clip": False}

#: (name, variant, base variant's name for the check); the first group runs in TF32 and bf16
VARIANTS: list[tuple[str, dict, str | None]] = [
    ("trainer (clip, soft target, stats)", {}, None),
    ("no grad clipping", {"clip": False}, "trainer (clip, soft target, stats)"),
    ("no soft target update", {"soft": False}, "trainer (clip, soft target, stats)"),
    ("no stats", {"stats": False}, "trainer (clip, soft target, stats)"),
    ("bare (no clip/soft/stats)", {"clip": False, "soft": False, "stats": False}, "trainer (clip, soft target, stats)"),
    ("in-place ReLU", {"inplace": True}, "trainer (clip, soft target, stats)"),
    ("input padded to 64", {"pad": 64}, None),
    ("input padded to 52", {"pad": 52}, None),
    ("in-place ReLU + pad 64", {"inplace": True, "pad": 64}, "input padded to 64"),
    ("foreach Adam (not fused)", {"fused": False}, "trainer (clip, soft target, stats)"),
]
BASE = "market: pad 52, in-place ReLU, no clip"
FUSED_VARIANTS: list[tuple[str, dict, str | None]] = [
    (BASE, MARKET, None),
    ("a1: addmm+ReLU epilogue, no-grad forwards", MARKET | {"act": "nograd"}, BASE),
    ("a2: addmm+ReLU epilogue, all forwards", MARKET | {"act": "all"}, BASE),
    ("b: fused Triton loss", MARKET | {"loss": "fused"}, BASE),
    ("c: next-obs forwards on a forked stream", MARKET | {"fork": True}, BASE),
    ("d1: Triton Adam + soft update per tensor", MARKET | {"adam": "triton"}, BASE),
    ("d2: flat buffers, one Adam + soft update launch", MARKET | {"adam": "flat"}, BASE),
    ("e1: torch.compile default", MARKET | {"compile": "default"}, BASE),
    ("e2: torch.compile max-autotune-no-cudagraphs", MARKET | {"compile": "max-autotune-no-cudagraphs"}, BASE),
    ("f1: fused a2+b+c+d1 (the trainer's fused_step)", MARKET | {"act": "all", "loss": "fused", "fork": True,
                                                                  "adam": "triton"}, BASE),
    ("f2: fused a2+b+c+d2", MARKET | {"act": "all", "loss": "fused", "fork": True, "adam": "flat"}, BASE),
    ("f3: compile default + d2", MARKET | {"compile": "default", "adam": "flat"}, BASE),
]  # fmt: skip


def agent_step(batch: int, obs_dim: int, precision: str, device: torch.device, fused: bool):
    """The trainer's learn step (market preset: no clipping, soft target update, loss sums) from a
    fixed batch, warmed up and captured; returns the function that runs one step."""
    from gper import PrioritizedReplayBuffer
    from gper.dqn import Agent, Config, FixedBatch, padded_width, replay_spec, resolve

    settings = dict(env="market", device=str(device), num_envs=1, hidden=(512, 512), precision=precision)
    cfg = resolve(
        Config(**settings, batch_size=batch, learning_starts=batch, buffer_size=batch, fused_step=fused), device
    )
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


def _fmt(diffs: dict | None, key: str) -> str:
    return "" if diffs is None or key not in diffs else f"{diffs[key]:.1e}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--only", nargs="+", help="run only the variants whose name holds one of these strings")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile variants")
    p.add_argument("--precisions", nargs="+", default=["tf32", "bf16"], choices=("tf32", "bf16"))
    p.add_argument("--profile", action="store_true", help="also print the kernels of one eager step")
    args = p.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    env = environment(device)
    print(header_line(env, "train-step variants"))
    columns = ["precision", "variant", "ms_median", "ms_min", "loss_diff", "td_diff", "grad_diff", "step_diff",
               "target_diff", "build_s"]  # fmt: skip
    files = ResultFiles(Path(args.out), env, columns, prefix="train-step-variants")
    rows = []

    def record(precision, name, t, diffs, build_s):
        row = [precision, name, f"{t.median_us / 1e3:.3f}", f"{t.min_us / 1e3:.3f}"]
        row += [_fmt(diffs, k) for k in ("loss", "td", "grads", "step", "target")] + [f"{build_s:.1f}"]
        rows.append(row)
        files.append([dict(zip(columns, row, strict=True))])
        print(" | ".join(row), flush=True)

    for precision in args.precisions:
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        groups = VARIANTS + (FUSED_VARIANTS if precision == "tf32" else [])
        probes: dict[str, dict] = {}
        for name, variant, base in groups:
            if variant.get("compile") and args.no_compile:
                continue
            if args.only and not any(s in name for s in args.only) and name not in (BASE, VARIANTS[0][0]):
                continue
            start = time.perf_counter()
            variant = dict(variant, bf16=precision == "bf16")
            step = make_step(args.batch, 51, variant, device)
            probe: dict = {}
            step(probe)  # the first step, eager: compiles what compiles, and is compared with the base's
            probes[name] = probe
            diffs = None
            if base in probes:
                ref = {n: v for n, v, _ in groups}[base]
                same = all(variant.get(k, True) == ref.get(k, True) for k in ("clip", "soft"))
                diffs = differences(probe, probes[base], same)
            graph = capture_graph(step)
            build_s = time.perf_counter() - start
            t = time_fn(graph.replay, iters=200, repeats=5, device=device)
            record(precision, name, t, diffs, build_s)
            graph.reset()
            del graph, step
            torch.cuda.empty_cache()
            if args.profile and precision == "tf32" and name in (VARIANTS[0][0], BASE):
                from torch.profiler import ProfilerActivity, profile

                prof_step = make_step(args.batch, 51, variant, device)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        prof_step()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
        for fused in (False, True):
            start = time.perf_counter()
            run = agent_step(args.batch, 51, precision, device, fused)
            build_s = time.perf_counter() - start
            t = time_fn(run, iters=200, repeats=5, device=device)
            record(precision, f"gper.dqn.Agent learn step (market preset{', fused_step' if fused else ''})", t, None,
                   build_s)  # fmt: skip
            del run
    headers = ["precision", "variant", "ms/step (median)", "ms/step (min)", "loss Δ", "td Δ", "grad Δ", "step Δ",
               "target Δ", "build s"]  # fmt: skip
    right = [False, False] + [True] * 8
    print_table(headers, rows, right)
    files.write_markdown(
        "\n".join(
            [
                "# The learning step's variants (fixed batch, one CUDA graph each)",
                "",
                header_line(env, "train-step variants"),
                "",
                f"51 -> 512 -> 512 -> 45, batch {args.batch}, 200 replays x 5 repeats. Δ: the largest difference "
                "from the base variant's first step, relative to the base's largest magnitude; step Δ and target Δ: "
                "of the online and target parameters' change, only where the gradients are the base's bit for bit "
                "(the target moves by tau * lr, so float32 rounding alone makes a few percent of target Δ).",
                "",
                format_markdown(headers, rows, right),
                "",
            ]
        )
    )
    print(f"wrote {files.md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

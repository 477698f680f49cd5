"""How much does Adam's epsilon shrink a run's steps? Read from a checkpoint's Adam moments.

Adam's step for a weight is ``lr * m_hat / (sqrt(v_hat) + eps)``. Where ``sqrt(v_hat)`` is well
below ``eps`` the step is about ``lr * m_hat / eps``: SGD with a step smaller than ``lr``. For each
parameter of a checkpoint (its ``trainer.pt``) of a learner that keeps a ``torch.optim.Adam`` (one
MLP agent, or the pixel learner, one agent or a population, whose rows then hold all its agents;
not an MLP population, whose Adam is gper's own) this prints the share of weights whose
``sqrt(v_hat)`` is below ``--eps`` and below ``--against``, its median, and the norm of Adam's step
under ``--eps`` against its norm under ``--against`` (same moments, so 1.0 means the epsilon does
not matter and 0.1 means a tenth of the step).

    python benchmarks/adam_eps_steps.py --checkpoint runs/<run>/checkpoints/step-...
    python benchmarks/adam_eps_steps.py --run-steps 12000      # a short CPU atari:Pong run first

Developer tool (moments, not timings): single thread on the CPU, deterministic for a checkpoint.
Writes the table to ``<out>/adam-eps-steps-<stamp>.md``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from gper.bench.report import environment, format_markdown, header_line


def short_run(steps: int, folder: Path) -> Path:
    """A CPU ``atari:Pong`` run of ``steps`` env steps (the CPU preset, Adam at ``1.5e-4``, the epsilon
    the question is about) with a checkpoint at its end; returns the checkpoint's directory."""
    from gper.dqn import Config, train

    cfg = Config(
        env="atari:Pong", device="cpu", total_steps=steps, adam_eps=1.5e-4, run_dir=str(folder), run_name="run",
        progress=False, tensorboard=False, eval_every=0, save=True, checkpoint_every=0,
    )  # fmt: skip
    train(cfg, log=lambda *_: None)
    return sorted((folder / "run" / "checkpoints").iterdir())[-1]


def rows(checkpoint: Path, eps: float, against: float) -> list[tuple]:
    """One row a parameter: index, shape, Adam steps taken, shares below ``eps`` and ``against``,
    median root, step ratio."""
    state = torch.load(checkpoint / "trainer.pt", weights_only=True, map_location="cpu")
    if "optimizer" not in state["agent"]:
        raise SystemExit(f"{checkpoint}: its learner keeps no torch.optim.Adam (an MLP population's is gper's own)")
    optimizer = state["agent"]["optimizer"]
    beta1, beta2 = optimizer["param_groups"][0]["betas"]
    out = []
    for index, moments in sorted(optimizer["state"].items()):
        step = float(moments["step"].max()) if torch.is_tensor(moments["step"]) else float(moments["step"])
        m = moments["exp_avg"].double() / (1 - beta1**step)
        root = (moments["exp_avg_sq"].double() / (1 - beta2**step)).sqrt()
        ratio = (m / (root + eps)).norm() / (m / (root + against)).norm()
        below = [float((root < e).double().mean()) for e in (eps, against)]
        out.append((index, tuple(moments["exp_avg"].shape), int(step), *below, float(root.median()), float(ratio)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="a checkpoint directory (holding trainer.pt)")
    p.add_argument("--run-steps", type=int, default=12_000, help="without --checkpoint: a CPU Pong run this long")
    p.add_argument("--eps", type=float, default=1.5e-4, help="the epsilon asked about")
    p.add_argument("--against", type=float, default=1e-8, help="the epsilon compared with")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        if args.checkpoint is not None:
            checkpoint, source = Path(args.checkpoint), f"checkpoint `{args.checkpoint}`"
        else:
            checkpoint = short_run(args.run_steps, Path(scratch))
            source = f"a CPU `atari:Pong` run of {args.run_steps:,} env steps (CPU preset, Adam eps 1.5e-4)"
        table = rows(checkpoint, args.eps, args.against)
    lines = [
        header_line(environment(torch.device("cpu"))),
        "",
        f"Adam's moments of {source}: the share of weights whose sqrt(v_hat) is below {args.eps:g} and",
        f"below {args.against:g}, the median sqrt(v_hat), and the norm of Adam's step under eps = {args.eps:g}",
        f"over its norm under {args.against:g} (weights whose moments are 0, inputs that are always 0, count",
        "in both shares and move under neither).",
        "",
    ]
    headers = ["parameter", "shape", "Adam steps", f"below {args.eps:g}", f"below {args.against:g}"]
    headers += ["median sqrt(v_hat)", "step norm ratio"]
    cells = [
        [str(index), "x".join(map(str, shape)), f"{step:,}", f"{below:.3f}", f"{below_against:.3f}", f"{median:.2e}"]
        + [f"{ratio:.3f}"]
        for index, shape, step, below, below_against, median, ratio in table
    ]
    lines.append(format_markdown(headers, cells, right=[True, False, True, True, True, True, True]))
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"adam-eps-steps-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(text + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

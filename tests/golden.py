"""Recorded reference runs: the same seed must give the same samples, priorities and trained
parameters, release after release, unless a change says why it may not.

:func:`replay_scenario` drives a buffer through adds (with wrap-around), samples and priority
updates in every sampling mode; :func:`training_scenario` runs two short trainings. Their
outputs were recorded with the code as it stood before gper was split into layers
(``tests/data/golden-*.pt``) and are compared bit for bit in ``tests/replay/test_golden.py``.

The CPU trainings are recorded per CPU (:func:`cpu_platforms`): on an Intel Xeon the AMD record's
market run differs in the last bits (most likely in MKL's float32 matmuls, whose code paths
differ by vendor and instruction set), and cartpole's episodes turn such a difference into
another run. ``golden-train-cpu-AuthenticAMD.pt`` is the
code before the split, on the AMD EPYC machines of that time; ``golden-train-cpu-GenuineIntel-AVX512.pt``
was recorded on an Intel Xeon at 14fae3d, whose CPU trainings equalled that record on the AMD
machines (the continuous integration runs of abd6eab).

Re-record (only when a change is meant to alter samples, and say so in its commit):

    GPER_RECORD_GOLDEN=1 python -m pytest tests/replay/test_golden.py
"""

from __future__ import annotations

import platform
import tempfile
from pathlib import Path

import torch

import gper
from helpers import run_checkpoint

DATA = Path(__file__).parent / "data"
SPEC = {"obs": ((3,), torch.float32), "action": ((), torch.int64), "done": ((), torch.bool)}
MODES = ("proportional", "stratified", "rank", "uniform")


def _items(n: int, start: int, device) -> dict[str, torch.Tensor]:
    k = torch.arange(start, start + n, device=device)
    obs = torch.stack([k * 1.0, k * 0.5, -k * 1.0], 1).float()
    return {"obs": obs, "action": k.long(), "done": k % 3 == 0}


def _td(n: int, round_: int, device) -> torch.Tensor:
    # dyadic magnitudes (|td| + 2^-12 = 2^k), so priorities and their sums are exact in both back ends
    k = (torch.arange(n, device=device) * 7 + round_ * 3) % 9 - 2
    sign = torch.where(torch.arange(n, device=device) % 2 == 0, 1.0, -1.0)
    return ((torch.pow(2.0, k.double()) - 2.0**-12) * sign).float()


def replay_scenario(backend: str, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Every mode and arity: add, sample, update (batch and raw indices), wrap, sample again."""
    out: dict[str, torch.Tensor] = {}
    for mode in MODES:
        for arity in (4, 32):
            for norm in ("global", "batch"):
                if mode == "uniform" and norm == "batch":
                    continue
                rb = gper.PrioritizedReplayBuffer(
                    1000,
                    SPEC,
                    alpha=0.5,
                    beta=0.4,
                    eps=2.0**-12,
                    sampling=mode,
                    weight_norm=norm,
                    device=device,
                    backend=backend,
                    seed=7,
                    arity=arity,
                    rank_refresh_interval=2,
                )
                tag = f"{mode}/k{arity}/{norm}"
                rb.add(_items(600, 0, device))
                for r in range(4):
                    b = rb.sample(64, beta=0.4 + 0.1 * r)
                    out[f"{tag}/sample{r}/indices"] = b.indices.cpu().clone()
                    out[f"{tag}/sample{r}/weights"] = b.weights.cpu().clone()
                    out[f"{tag}/sample{r}/generations"] = b.generations.cpu().clone()
                    out[f"{tag}/sample{r}/obs"] = b["obs"].cpu().clone()
                    out[f"{tag}/sample{r}/action"] = b["action"].cpu().clone()
                    if r % 2 == 0:
                        rb.update_priorities(b, _td(64, r, device))
                    else:
                        rb.update_priorities(b.indices, _td(64, r, device))
                    if r == 1:
                        rb.add(_items(500, 600, device))  # wraps: slots 100..599 of the first adds stay
                filled = torch.arange(1000, device=device)
                out[f"{tag}/priorities"] = rb.priorities(filled).cpu().clone()
                stats = rb.stats()
                out[f"{tag}/counters"] = torch.tensor(
                    [stats["size"], stats["cursor"], stats["rng_offset"], stats["stale_updates"]]
                )
                out[f"{tag}/max_priority"] = torch.tensor(stats["max_priority"])
    return out


def cpu_platforms() -> list[str]:
    """This CPU's names for the recorded trainings, most specific first: its vendor with torch's
    vector capability, then the vendor alone (``["GenuineIntel-AVX512", "GenuineIntel"]``)."""
    vendor = platform.machine() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            vendor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), vendor)
    except OSError:
        pass
    return [f"{vendor}-{torch.backends.cpu.get_cpu_capability()}", vendor]


def training_scenario(device: str) -> dict[str, torch.Tensor]:
    """The Q-network's parameters after two short trainings (cartpole, market) on ``device``."""
    from gper.dqn import Config, train  # the trainer is above the library: imported only here

    out: dict[str, torch.Tensor] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU reductions depend on the thread count
    try:
        for env in ("cartpole", "market"):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = Config(
                    env=env,
                    device=device,
                    seed=3,
                    total_steps=2400,
                    num_envs=4,
                    learning_starts=256,
                    batch_size=64,
                    buffer_size=2048,
                    hidden=(32, 32),
                    epoch_steps=800,
                    bars=3000,
                    test_bars=500,
                    progress=False,
                    save=True,
                    run_dir=tmp,
                    run_name="golden",
                )
                train(cfg, log=lambda _line: None)
                trainer, replay = run_checkpoint(Path(tmp) / "golden")
                agent = trainer["agent"]
                for name, value in agent["qnet"].items():
                    out[f"{env}/qnet/{name}"] = value.clone()
                out[f"{env}/replay/tree"] = replay["tree"].clone()
                out[f"{env}/replay/counters"] = replay["counters"].clone()
                out[f"{env}/counters"] = agent["counters"].clone()
    finally:
        torch.set_num_threads(threads)
    return out

"""What a run reports once an epoch: the phase line, the busy fraction."""

from __future__ import annotations

import torch

# the phase names of the user's original design (DESIGN.md section 6), in print order
PHASE_ORDER = ("per_sample", "upload", "fwd_bwd", "adam", "per_update")


def _busy_fraction(
    phases: dict[str, tuple[float, int]], collects: int, trains: int, wall: float, cuda: bool
) -> float | None:
    """Mean GPU phase times times step counts over the epoch's wall time: how busy the GPU was."""
    if "collect" not in phases or wall <= 0 or not cuda:
        return None
    learn = sum(phases[name][0] for name in PHASE_ORDER if name in phases)
    return (phases["collect"][0] * collects + learn * trains) / 1e3 / wall


def format_phase_line(summary: dict[str, tuple[float, int]], device: torch.device) -> str:
    """The user's line: ``GPU phase timing (178 batches avg): per_sample=0.02ms ... total=1.04ms``,
    followed by the data-collection phase (``collect``) on its own."""
    kind = "GPU" if torch.device(device).type == "cuda" else "CPU"
    learn = [name for name in PHASE_ORDER if name in summary]
    parts = []
    if learn:
        n = max(summary[name][1] for name in learn)
        fields = " ".join(f"{name}={summary[name][0]:.2f}ms" for name in learn)
        total = sum(summary[name][0] for name in learn)
        parts.append(f"{kind} phase timing ({n} batches avg): {fields} total={total:.2f}ms")
    elif "collect" in summary:
        parts.append(f"{kind} phase timing: no training steps yet (learning starts later)")
    if "collect" in summary:
        ms, n = summary["collect"]
        parts.append(f"collect={ms:.3f}ms ({n} collections avg)")
    return " | ".join(parts) if parts else f"{kind} phase timing: no steps timed"

"""Same seed, same samples: today's code against runs recorded before the library was split
into layers (see ``tests/golden.py``). Samples, weights, priorities and counters must match bit
for bit on each back end; so must the parameters of two short CPU trainings (deterministic there)."""

from __future__ import annotations

import os

import pytest
import torch

from golden import DATA, cpu_platforms, replay_scenario, training_scenario

RECORD = os.environ.get("GPER_RECORD_GOLDEN") == "1"


def _compare(name: str, got: dict[str, torch.Tensor]) -> None:
    path = DATA / name
    if RECORD:
        DATA.mkdir(exist_ok=True)
        torch.save(got, path)
        pytest.skip(f"recorded {path}")
    want = torch.load(path, weights_only=True)
    assert sorted(got) == sorted(want), "the scenario's outputs changed names"
    bad = [k for k in want if got[k].dtype != want[k].dtype or not torch.equal(got[k], want[k])]
    if bad:
        k = bad[0]
        raise AssertionError(f"{len(bad)} of {len(want)} outputs differ from {name}; first {k}: {got[k]} vs {want[k]}")


def test_replay_matches_recorded_samples(backend):
    _compare(f"golden-replay-cpu-{backend}.pt", replay_scenario(backend, "cpu"))


@pytest.mark.gpu
def test_replay_matches_recorded_samples_on_gpu():
    _compare("golden-replay-cuda-triton.pt", replay_scenario("triton", "cuda"))


def test_training_matches_recorded_parameters():
    """Against the record of this kind of CPU (see ``tests/golden.py``: they round differently)."""
    names = [f"golden-train-cpu-{name}.pt" for name in cpu_platforms()]
    recorded = [name for name in names if (DATA / name).exists()]
    if RECORD:
        recorded = names  # a record is made for this CPU (vendor and vector capability)
    elif not recorded:
        pytest.skip(f"no recorded training for this CPU ({' or '.join(names)}): GPER_RECORD_GOLDEN=1 records one")
    _compare(recorded[0], training_scenario("cpu"))

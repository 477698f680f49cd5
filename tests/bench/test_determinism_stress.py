"""``benchmarks/determinism_stress.py`` on the CPU: its comparison finds what differs between two
checkpoints and nothing between two runs that are the same (CPU runs are deterministic), and it
writes its table."""

from __future__ import annotations

import csv
import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "determinism_stress.py"


@pytest.fixture(scope="module")
def stress():
    spec = importlib.util.spec_from_file_location("determinism_stress", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_differences_names_each_key_and_counts_elements(stress):
    a = {"w": torch.zeros(3), "s": torch.zeros(2), "returns": [1.0, 2.0], "iteration": 5}
    b = {"w": torch.tensor([0.0, 1.0, 1.0]), "s": torch.zeros(3), "returns": [1.0, 2.5], "iteration": 5, "x": 1}
    assert stress.differences(a, b) == ["returns", "s[shape]", "w[2]", "x"]
    assert stress.differences(a, dict(a)) == []


def test_flatten_keeps_the_returns_whole(stress):
    flat = stress.flatten({"agent": {"qnet": {"w": 1}, "opt": [{"a": 2}]}, "returns": [1.0, 2.0]})
    assert flat == {"agent.qnet.w": 1, "agent.opt.0.a": 2, "returns": [1.0, 2.0]}


def test_on_the_cpu_two_runs_and_a_resumed_one_are_equal_and_a_changed_checkpoint_is_found(stress, tmp_path):
    stress.main(["--device", "cpu", "--processes", "1", "--seconds", "0", "--total-steps", "400",
                 "--resume-at", "200", "--variants", "plain", "--out", str(tmp_path)])  # fmt: skip
    (path,) = tmp_path.glob("determinism-stress-cpu-*.csv")
    (row,) = csv.DictReader(path.open())
    assert (row["variant"], row["runs"], row["whole2_differ"], row["resumed_differ"]) == ("plain", "1", "0", "0")
    assert "| plain | the test's | unset | 1 | 0 | 0 |" in path.with_suffix(".md").read_text()

    from gper.dqn import Config, train

    settings = stress.TEST_SETTINGS | dict(device="cpu", total_steps=400, run_dir=str(tmp_path))
    for name in ("a", "b"):
        train(Config(**settings, run_name=name), log=lambda _: None)
    assert stress.first_difference(tmp_path / "a", tmp_path / "b") is None
    # the second run's last checkpoint with one weight changed: found there, and named
    last = tmp_path / "b" / "checkpoints" / "step-000000000400"
    state = torch.load(last / "trainer.pt", weights_only=True)
    state["agent"]["qnet"]["net.0.weight"][0, 0] += 1.0
    torch.save(state, last / "trainer.pt")
    assert stress.first_difference(tmp_path / "a", tmp_path / "b") == (400, ["agent.qnet.net.0.weight[1]"])
    shutil.rmtree(tmp_path / "b" / "checkpoints" / "step-000000000200")  # only checkpoints both wrote count
    assert stress.first_difference(tmp_path / "a", tmp_path / "b")[0] == 400

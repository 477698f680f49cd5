"""``torchrun --nproc-per-node 2 -m gper train`` on this host's CPU (gloo on 127.0.0.1): a tiny
cartpole run in exact and local mode finishes, rank 0 alone writes the run folder, the networks
stay the same on both ranks bit for bit; a run resumed mid-way ends where the whole run does;
another world size is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from spawn import free_port

SRC = Path(__file__).resolve().parents[2] / "src"
#: 200 collection iterations of 4 envs, 4 epochs of 200 env steps, checkpoints after epochs 2 and 4
TINY = [
    "--env", "cartpole", "--device", "cpu", "--total-steps", "800", "--num-envs", "4", "--batch-size", "16",
    "--buffer-size", "1000", "--learning-starts", "128", "--epoch-steps", "200", "--hidden", "16", "16",
    "--target-every", "20", "--eval-every", "2", "--eval-episodes", "2", "--checkpoint-every", "2",
    "--progress", "False", "--tensorboard", "False",
]  # fmt: skip
EPOCHS = 4


def torchrun(nproc: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``gper train`` under torchrun with ``nproc`` processes, its output; bounded in time."""
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "gper", "train", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def ranks_state(ckpt: Path) -> list[dict]:
    return [torch.load(ckpt / name, weights_only=True) for name in ("trainer.pt", "trainer.rank1.pt")]


def same_network(a: dict, b: dict) -> bool:
    """The online and target networks and Adam's moments, bit for bit."""
    nets = all(torch.equal(a["agent"][k][n], b["agent"][k][n]) for k in ("qnet", "target") for n in a["agent"][k])
    sa, sb = a["agent"]["optimizer"]["state"], b["agent"]["optimizer"]["state"]
    moments = all(torch.equal(sa[i][m], sb[i][m]) for i in sa for m in ("exp_avg", "exp_avg_sq"))
    return nets and moments


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    out = torchrun(2, *TINY, "--distributed", "exact", "--run-dir", str(runs), "--run-name", "whole")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return runs, out


def check_run(runs: Path, out: subprocess.CompletedProcess, mode: str) -> None:
    folder = runs / "whole"
    assert [p.name for p in runs.iterdir()] == ["whole"]  # one run folder, written once
    assert {"config.json", "metrics.jsonl", "summary.json", "plot.png"} <= {p.name for p in folder.iterdir()}
    config = json.loads((folder / "config.json").read_text())
    assert config["distributed"] == mode
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert sum("charts/SPS" in r for r in records) == EPOCHS  # rank 0's epoch lines only
    assert sum("eval/mean_return" in r for r in records) == 2
    # one summary, one phase line an epoch, from rank 0, with the gradient all-reduce as a phase
    assert out.stdout.count("gper train: done") == 1
    assert out.stdout.count("grad_sync=") >= EPOCHS - 1, out.stdout[-2000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["env_steps"] == 800 and summary["train_steps"] == 168 and "grad_sync" in summary["phase_ms"]
    for ckpt in sorted((folder / "checkpoints").iterdir()):
        rank0, rank1 = ranks_state(ckpt)
        assert rank0["world_size"] == 2 and rank1["rank"] == 1
        assert same_network(rank0, rank1), ckpt
        # each rank its own environments (seed + rank) and its own shard
        assert not torch.equal(rank0["agent"]["obs"], rank1["agent"]["obs"])
        assert rank0["replay_group"]["shared_rng"] == rank1["replay_group"]["shared_rng"]


def test_exact_mode_trains_on_two_processes(exact_run):
    check_run(*exact_run, "exact")


def test_local_mode_trains_on_two_processes(tmp_path):
    out = torchrun(2, *TINY, "--distributed", "local", "--run-dir", str(tmp_path), "--run-name", "whole")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    check_run(tmp_path, out, "local")


def test_resumed_mid_way_ends_where_the_whole_run_does(exact_run):
    runs, _ = exact_run
    ckpts = sorted((runs / "whole" / "checkpoints").iterdir())
    mid, end = ckpts[0], ckpts[-1]
    assert mid.name == "step-000000000400" and end.name == "step-000000000800"
    out = torchrun(2, "--resume", str(mid), "--run-dir", str(runs), "--run-name", "resumed", "--progress", "False")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    whole, resumed = ranks_state(end), ranks_state(runs / "resumed" / "checkpoints" / end.name)
    for a, b in zip(whole, resumed, strict=True):
        assert same_network(a, b)
        assert torch.equal(a["agent"]["obs"], b["agent"]["obs"]) and torch.equal(a["agent"]["sums"], b["agent"]["sums"])
        assert a["replay_group"] == b["replay_group"] and a["replay_counts"] == b["replay_counts"]


def test_another_world_size_is_refused(exact_run):
    runs, _ = exact_run
    out = torchrun(1, "--resume", str(runs / "whole"), "--run-dir", str(runs), "--run-name", "one", timeout=60)
    assert out.returncode != 0
    assert "written by a run of 2 processes, this one has 1" in out.stderr, out.stderr[-2000:]
    assert not (runs / "one").exists()  # refused before anything was written


TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


def test_the_mode_follows_the_launch():
    from gper.training.parallel import resolve_mode

    assert resolve_mode("auto", {}) == "off" and resolve_mode("off", {}) == "off"
    assert resolve_mode("auto", TORCHRUN_ENV) == "exact" and resolve_mode("local", TORCHRUN_ENV) == "local"
    assert resolve_mode("auto", TORCHRUN_ENV | {"WORLD_SIZE": "1"}) == "off"
    assert resolve_mode("exact", TORCHRUN_ENV | {"WORLD_SIZE": "1"}) == "exact"
    with pytest.raises(ValueError, match="torchrun's environment"):
        resolve_mode("exact", {})
    with pytest.raises(ValueError, match="each would train alone"):
        resolve_mode("off", TORCHRUN_ENV)
    with pytest.raises(ValueError, match="must be one of"):
        resolve_mode("global", TORCHRUN_ENV)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(n_step=3), "sharded trajectory replay is not built yet"),
        (dict(replay="trajectory"), "sharded trajectory replay is not built yet"),
        (dict(env="bitflip:8"), "sharded trajectory replay is not built yet"),
        (dict(sampling="rank"), "sampling rank is not supported"),
        (dict(buffer_size=1001), "not a multiple of the world size 2"),
    ],
)
def test_settings_a_data_parallel_run_refuses(change, message):
    import dataclasses

    import gper.dqn
    from gper.dqn.parallel import check_settings

    cfg = gper.dqn.resolve(gper.dqn.Config(env="cartpole", buffer_size=1000), torch.device("cpu"))
    check_settings(cfg, 2)
    with pytest.raises(ValueError, match=message):
        check_settings(dataclasses.replace(cfg, **change), 2)

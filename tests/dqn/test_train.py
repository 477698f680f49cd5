"""Short trainings: on the CPU the run folder, resume, sampling modes, determinism, the market
evaluation, a Gymnasium env and the messages for missing packages; on a GPU (marked ``gpu``) no
host synchronisation inside an epoch, graphs that capture and replay, and a short training."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from gper.dqn import Config, setup, train
from gper.dqn.algorithm import stored_config
from gper.training.runlog import read_metrics
from gper.training.timing import PhaseTimer
from helpers import run_checkpoint

SMALL = dict(device="cuda", total_steps=20_000, learning_starts=512, batch_size=256, buffer_size=4096, progress=False)


# ---------------------------------------------------------------------------- CPU


def test_smoke_training_writes_the_run_folder(tmp_path, smoke):
    lines = []
    results = train(Config(**smoke, run_dir=str(tmp_path)), log=lines.append)
    folder = tmp_path / results.run_dir.split("/")[-1]
    assert results.env_steps == 600 and results.train_steps == 100 and results.device == "cpu"
    assert results.episodes > 0 and results.mean_return_last100 > 0
    assert set(results.phase_ms) == {"collect", "per_sample", "upload", "fwd_bwd", "adam", "per_update"}
    assert any("no CUDA GPU" in line for line in lines)
    assert sum(bool(re.match(r"CPU phase timing \(\d+ batches avg\): per_sample=", line)) for line in lines) == 2
    for name in ("config.json", "metrics.jsonl", "summary.json", "plot.png"):
        assert (folder / name).exists(), name
    last = folder / "checkpoints" / "step-000000000600"  # the end's; with 3 epochs no periodic one is due
    assert [p.name for p in (folder / "checkpoints").iterdir()] == [last.name]
    assert sorted(p.name for p in last.iterdir()) == ["replay.safetensors", "trainer.pt"]
    rows = read_metrics(folder / "metrics.jsonl")
    assert any("charts/episodic_return" in r for r in rows)
    assert any("losses/td_loss" in r and "charts/SPS" in r for r in rows)
    assert json.loads((folder / "summary.json").read_text())["train_steps"] == 100


def test_first_epoch_logs_its_losses_on_the_cpu(tmp_path, smoke):
    # the epoch's losses are sums on the device minus those at the epoch's start: on the CPU a
    # start "copy" that aliased the live sums made the first epoch's losses exactly 0
    results = train(Config(**smoke | dict(learning_starts=32), run_dir=str(tmp_path)))
    metrics = read_metrics(tmp_path / results.run_dir.split("/")[-1] / "metrics.jsonl")
    rows = [r for r in metrics if "losses/td_loss" in r]
    first = rows[0]
    assert first["global_step"] == 200
    assert first["losses/td_loss"] > 0 and first["losses/q_values"] != 0


def test_cpu_run_records_what_ran_and_keeps_what_was_asked(tmp_path, smoke):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = train(Config(**smoke, run_dir=str(tmp_path)))
        assert torch.get_num_threads() == 2  # put back after the run
    finally:
        torch.set_num_threads(before)
    folder = tmp_path / results.run_dir.split("/")[-1]
    cfg = json.loads((folder / "config.json").read_text())
    # what ran: no CUDA graphs or TF32 on the CPU; one torch thread for this small network
    assert cfg["cuda_graphs"] is False and cfg["precision"] == "fp32" and cfg["threads"] == 1
    # what the checkpoint keeps is what was asked: resumed on a GPU, it runs as a GPU run
    stored = stored_config(folder)
    assert stored.cuda_graphs is True and stored.precision == "tf32" and stored.threads is None


def test_resume_continues_from_the_checkpoint(tmp_path, smoke):
    first = train(Config(**smoke, run_dir=str(tmp_path), run_name="a"), log=lambda _: None)
    resumed = train(
        Config(**{**smoke, "total_steps": 1000}, run_dir=str(tmp_path), run_name="b", resume=str(tmp_path / "a")),
        log=lambda _: None,
    )
    assert resumed.env_steps == 1000 and resumed.train_steps == 200
    assert resumed.episodes > first.episodes  # the episode history came along
    trainer, _ = run_checkpoint(tmp_path / "b")
    assert trainer["agent"]["counters"].tolist() == [1000.0, 200.0]


def test_prioritized_and_uniform_draw_different_batches(tmp_path, smoke):
    a = train(Config(**smoke, run_dir=str(tmp_path), run_name="p"), log=lambda _: None)
    b = train(Config(**smoke, run_dir=str(tmp_path), run_name="u", sampling="uniform"), log=lambda _: None)
    assert a.env_steps == b.env_steps
    pa = run_checkpoint(tmp_path / "p")[0]["agent"]["qnet"]
    pb = run_checkpoint(tmp_path / "u")[0]["agent"]["qnet"]
    assert any(not torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.parametrize("sampling", ["rank", "stratified"])
def test_other_sampling_modes_train(tmp_path, smoke, sampling):
    results = train(Config(**smoke, run_dir=str(tmp_path), sampling=sampling), log=lambda _: None)
    assert results.train_steps == 100 and results.episodes > 0


def test_same_seed_same_run(tmp_path, smoke):
    a = train(Config(**smoke, run_dir=str(tmp_path), run_name="x"), log=lambda _: None)
    b = train(Config(**smoke, run_dir=str(tmp_path), run_name="y"), log=lambda _: None)
    assert a.mean_return_last100 == b.mean_return_last100
    pa = run_checkpoint(tmp_path / "x")[0]["agent"]["qnet"]
    pb = run_checkpoint(tmp_path / "y")[0]["agent"]["qnet"]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_market_smoke_training_evaluates_on_held_out_prices(tmp_path, smoke):
    cfg = Config(
        **{
            **smoke,
            "env": "market",
            "num_envs": 4,
            "episode_len": 32,
            "hidden": (32,),
            "bars": 5000,
            "test_bars": 1000,
        },
        run_dir=str(tmp_path),
    )
    lines: list[str] = []
    results = train(cfg, log=lines.append)
    ev = results.evaluation
    assert ev is not None and {"total_log_pnl", "buy_and_hold_log_pnl", "flat_log_pnl"} <= set(ev)
    # the two held-out numbers a market run prints, each saying what it is
    (test_line,) = [line for line in lines if line.startswith("market test")]
    assert test_line.startswith(f"market test, one walk over the whole held-out series ({ev['bars']} bars)")
    assert test_line.endswith(
        "(the eval lines: the mean return of 10 episodes of 32 bars of it, in the training reward's units)"
    )
    assert ev["flat_log_pnl"] == 0.0 and ev["bars"] > 100


def test_gymnasium_env_trains(tmp_path, smoke):
    pytest.importorskip("gymnasium")
    results = train(Config(**{**smoke, "env": "gym:CartPole-v1"}, run_dir=str(tmp_path)), log=lambda _: None)
    assert results.env_steps == 600 and results.train_steps == 100 and results.episodes > 0


def test_progress_bar_without_tqdm_names_the_extra(tmp_path, smoke, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    message = r'^the progress bar needs tqdm: pip install "\.\[train\]", or progress=False$'
    with pytest.raises(ImportError, match=message):
        train(Config(**{**smoke, "progress": True}, run_dir=str(tmp_path), run_name="p"), log=lambda _: None)
    assert not (tmp_path / "p").exists()  # checked before anything is built


def test_plot_without_matplotlib_is_skipped_with_one_line(tmp_path, smoke, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    lines = []
    results = train(Config(**{**smoke, "total_steps": 300}, run_dir=str(tmp_path), run_name="m"), log=lines.append)
    assert results.env_steps == 300 and (tmp_path / "m" / "summary.json").exists()
    assert not (tmp_path / "m" / "plot.png").exists()
    assert [line for line in lines if "matplotlib" in line] == [
        'gper train: no plot.png: the plot needs matplotlib: pip install ".[train]"'
    ]


# ---------------------------------------------------------------------------- GPU (and both)


@pytest.mark.gpu
@pytest.mark.parametrize("env", ["cartpole", "market"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_training_steps_never_sync(env, graphs):
    cfg, agent, _ = setup(Config(env=env, cuda_graphs=graphs, num_envs=8, hidden=(64, 64), **SMALL))
    for _ in range(80):  # fill past learning_starts; warm up and capture both steps
        agent.collect.run()
    for _ in range(5):
        agent.learn.run()
    assert agent.collect.captured == graphs and agent.learn.captured == graphs
    timer = PhaseTimer(agent.device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(20):
            agent.collect.run(timer if i % 5 == 0 else None)
            agent.learn.run(timer if i % 5 == 0 else None)
            agent.sync_target()
            agent.update_target(i + 1)  # the loop's call: a hard copy every target_every steps
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert torch.isfinite(agent.sums).all() and agent.counters[1].item() == 25
    learn = {"learn"} if agent.fused_learn else {"fwd_bwd", "adam"}  # one kernel phase, or the two
    assert set(timer.summary()) == {"collect", "per_sample", "upload", "per_update"} | learn


def test_graph_replays_train_the_network(device):
    """On CUDA the learn step replays from a graph; on the CPU it runs eagerly; both train, and
    the soft target update runs inside the step."""
    cfg, agent, _ = setup(Config(env="market", num_envs=16, hidden=(64, 64), **(SMALL | dict(device=device.type))))
    for _ in range(64):
        agent.collect.run()
    before = [p.detach().clone() for p in agent.qnet.parameters()]
    target_before = [p.detach().clone() for p in agent.target.parameters()]
    for _ in range(10):
        agent.learn.run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert agent.learn.captured == (device.type == "cuda")
    assert all(not torch.equal(a, p) for a, p in zip(before, agent.qnet.parameters(), strict=True))
    # soft target updates run inside the graph
    assert all(not torch.equal(a, p) for a, p in zip(target_before, agent.target.parameters(), strict=True))
    assert agent.counters[1].item() == 10 and torch.isfinite(agent.sums).all()


@pytest.mark.gpu
def test_one_graph_step_matches_eager_steps():
    """The one-graph learn step (priority update on a side stream alongside Adam, batch fields read
    in place from the sampled rows) computes what the eager phases compute, step for step."""
    cfg, eager, _ = setup(Config(env="market", num_envs=16, hidden=(64, 64), cuda_graphs=False, **SMALL))
    for _ in range(64):
        eager.collect.run()
    _, graphed, _ = setup(Config(env="market", num_envs=16, hidden=(64, 64), cuda_graphs=True, **SMALL))
    graphed.load_state_dict(eager.state_dict())
    for _ in range(12):  # 3 eager warm-up steps, then the capture and its replays
        eager.learn.run()
        graphed.learn.run()
    torch.cuda.synchronize()
    assert graphed.learn.captured and not eager.learn.captured
    slots = torch.arange(len(eager.rb), device="cuda")  # the filled ones (the rest read as NaN)
    torch.testing.assert_close(graphed.rb.priorities(slots), eager.rb.priorities(slots))
    for a, b in zip(graphed.qnet.parameters(), eager.qnet.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(graphed.beta_t, eager.beta_t)
    torch.testing.assert_close(graphed.counters, eager.counters)
    assert graphed.rb.stats()["max_priority"] == pytest.approx(eager.rb.stats()["max_priority"])


@pytest.mark.gpu
def test_short_gpu_training(tmp_path):
    lines = []
    results = train(Config(env="cartpole", run_dir=str(tmp_path), **SMALL), log=lines.append)
    assert results.device.startswith("cuda") and results.env_steps == 20_000
    assert any(line.startswith("GPU phase timing (") for line in lines)
    assert any(" busy " in line for line in lines)
    assert (tmp_path / results.run_dir.split("/")[-1] / "plot.png").exists()

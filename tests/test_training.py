"""The trainer's parts (phases, timing, episode records, readback, run folder) and short CPU trainings."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from gper.dqn import PRESETS, Config, QNetwork, padded_width, plan_steps, resolve, setup, train
from gper.dqn.report import format_phase_line
from gper.training.episodes import EpisodeTracker
from gper.training.phases import PhasedStep
from gper.training.readback import AsyncReadback
from gper.training.runlog import RunLog, plot_run, read_metrics
from gper.training.timing import PhaseTimer

CPU = torch.device("cpu")

# a short cartpole run: a few hundred steps, every part of the loop exercised
SMOKE = dict(
    env="cartpole",
    device="cpu",
    total_steps=600,
    learning_starts=200,
    batch_size=32,
    buffer_size=1000,
    epoch_steps=200,
    hidden=(16,),
    progress=False,
)


# ---------------------------------------------------------------------------- phases and timing


def test_phased_step_runs_phases_in_order_on_cpu():
    calls = []
    step = PhasedStep({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, CPU)
    timer = PhaseTimer(CPU)
    step.run()
    step.run(timer)
    assert calls == ["a", "b", "a", "b"]
    assert not step.captured  # no graphs on the CPU
    summary = timer.summary()
    assert set(summary) == {"a", "b"} and all(n == 1 and ms >= 0 for ms, n in summary.values())
    assert timer.summary() == {}  # read once


def test_phased_step_needs_a_phase():
    with pytest.raises(ValueError, match="at least one phase"):
        PhasedStep({}, CPU)


def test_phased_step_concurrent_phases_must_exist_and_run_in_order_eagerly():
    with pytest.raises(ValueError, match=r"concurrent phases \['c'\]"):
        PhasedStep({"a": lambda: None}, CPU, concurrent=("c",))
    calls = []
    step = PhasedStep({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, CPU, concurrent=("a",))
    step.run()
    assert calls == ["a", "b"]


def test_phase_line_has_the_users_format():
    summary = {
        "per_sample": (0.02, 178),
        "upload": (0.01, 178),
        "fwd_bwd": (0.90, 178),
        "adam": (0.10, 178),
        "per_update": (0.01, 178),
    }
    line = format_phase_line(summary, torch.device("cuda"))
    assert line == (
        "GPU phase timing (178 batches avg): per_sample=0.02ms upload=0.01ms fwd_bwd=0.90ms adam=0.10ms "
        "per_update=0.01ms total=1.04ms"
    )
    with_collect = format_phase_line({**summary, "collect": (0.05, 40)}, CPU)
    assert with_collect.startswith("CPU phase timing (178 batches avg)")
    assert with_collect.endswith("| collect=0.050ms (40 collections avg)")
    assert format_phase_line({"collect": (0.05, 40)}, CPU) == (
        "CPU phase timing: no training steps yet (learning starts later) | collect=0.050ms (40 collections avg)"
    )


# ---------------------------------------------------------------------------- episodes, readback


def test_episode_tracker_matches_a_plain_python_record():
    rng = random.Random(0)
    n, steps = 5, 300
    tracker = EpisodeTracker(n, CPU, ring=64)
    running, lengths, finished = [0.0] * n, [0] * n, []
    counter = torch.zeros((), dtype=torch.float64)
    drained = []
    for t in range(steps):
        reward = [rng.choice([0.0, 1.0, -0.5, 2.25]) for _ in range(n)]
        done = [rng.random() < 0.1 for _ in range(n)]
        counter += n
        tracker.record(torch.tensor(reward, dtype=torch.float64), torch.tensor(done), counter)
        for i in range(n):
            running[i] += reward[i]
            lengths[i] += 1
            if done[i]:
                finished.append((running[i], lengths[i], (t + 1) * n))
                running[i], lengths[i] = 0.0, 0
        if t % 50 == 49:
            rows, lost = tracker.drain(AsyncReadback(tracker.snapshot()).wait() | _host(tracker))
            assert lost == 0
            drained += rows
    assert drained == finished[: len(drained)] and len(finished) - len(drained) < 50 * n


def _host(tracker: EpisodeTracker) -> dict[str, torch.Tensor]:
    readback = AsyncReadback(tracker.snapshot())
    readback.start()
    return readback.wait()


def test_episode_tracker_reports_lost_episodes():
    tracker = EpisodeTracker(4, CPU, ring=4)
    for _ in range(3):  # 12 episodes end, the ring holds 4
        tracker.record(torch.ones(4, dtype=torch.float64), torch.ones(4, dtype=torch.bool), torch.tensor(1.0))
    rows, lost = tracker.drain(_host(tracker))
    assert lost == 8 and len(rows) == 4


def test_readback_copies_values():
    t = torch.arange(6.0)
    readback = AsyncReadback({"t": t})
    readback.start()
    t += 1  # after the copy was taken
    assert readback.wait()["t"].tolist() == [0, 1, 2, 3, 4, 5]


# ---------------------------------------------------------------------------- run folder


def test_runlog_writes_jsonl_and_plot(tmp_path):
    log = RunLog(tmp_path / "run")
    for i in range(150):
        log.log(i * 10, **{"charts/episodic_return": float(i), "charts/episodic_length": i})
    log.log(1500, **{"charts/SPS": 100.0, "timing/fwd_bwd_ms": 0.5, "losses/td_loss": float("nan")})
    log.close()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 151 and rows[-1]["losses/td_loss"] is None
    png = plot_run(log.metrics_path, tmp_path / "run" / "plot.png", title="t")
    assert png is not None and png.stat().st_size > 1000


# ---------------------------------------------------------------------------- config


def test_presets_fill_every_optional_field():
    for env in ("cartpole", "market", "gym:CartPole-v1"):
        for device in ("cuda", "cpu"):
            cfg = resolve(Config(env=env), torch.device(device))
            assert all(getattr(cfg, f) is not None for f in ("total_steps", "num_envs", "hidden", "batch_size"))
    assert resolve(Config(env="market"), CPU).batch_size < PRESETS["market"]["cuda"]["batch_size"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(env="atari"), "unknown environment"),
        (dict(batch_size=0), "batch_size must be an integer >= 1"),
        (dict(gamma=1.5), r"gamma must be in \[0, 1\]"),
        (dict(tau=0.0), "tau must be > 0"),
        (dict(learning_starts=10, batch_size=32), "learning_starts"),
        (dict(hidden=()), "hidden"),
        (dict(exploration_fraction=0.0), "exploration_fraction"),
        (dict(time_every=-1), "time_every"),
    ],
)
def test_bad_config_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        resolve(Config(**{**SMOKE, **change}), CPU)


def test_plan_counts_training_steps():
    cfg = resolve(Config(**{**SMOKE, "num_envs": 4, "train_every": 2}), CPU)
    iterations, trains = plan_steps(cfg)
    assert iterations == 150 and trains == len(range(50, 150, 2))


def test_network_shape():
    net = QNetwork(51, 45, (512, 512))
    assert net(torch.zeros(3, 51)).shape == (3, 45)
    assert sum(p.numel() for p in net.parameters()) == 51 * 512 + 512 + 512 * 512 + 512 + 512 * 45 + 45


def test_agent_pads_observations_to_16_bytes():
    assert [padded_width(d) for d in (1, 4, 5, 51, 52)] == [4, 4, 8, 52, 52]
    cfg, agent, _ = setup(Config(**(SMOKE | dict(env="market", bars=3000, test_bars=1000, num_envs=4))))
    assert agent.env.obs_dim == 51 and agent.obs_width == 52 and agent.qnet.net[0].in_features == 52
    assert agent.rb.spec["obs"] == ((52,), torch.float32)
    for _ in range(3):
        agent.collect.run()
    rows = agent.rb.storage["obs"][: len(agent.rb)]
    assert len(agent.rb) == 12 and torch.all(rows[:, 51] == 0) and torch.any(rows[:, :51] != 0)
    assert torch.all(agent.rb.storage["next_obs"][:12, 51] == 0)
    assert agent.greedy(torch.zeros(5, 51)).shape == (5,)


# ---------------------------------------------------------------------------- training


def test_smoke_training_writes_the_run_folder(tmp_path):
    lines = []
    results = train(Config(**SMOKE, run_dir=str(tmp_path)), log=lines.append)
    folder = tmp_path / results.run_dir.split("/")[-1]
    assert results.env_steps == 600 and results.train_steps == 100 and results.device == "cpu"
    assert results.episodes > 0 and results.mean_return_last100 > 0
    assert set(results.phase_ms) == {"collect", "per_sample", "upload", "fwd_bwd", "adam", "per_update"}
    assert any("no CUDA GPU" in line for line in lines)
    assert sum(bool(re.match(r"CPU phase timing \(\d+ batches avg\): per_sample=", line)) for line in lines) == 2
    for name in ("config.json", "metrics.jsonl", "summary.json", "plot.png", "checkpoint.pt"):
        assert (folder / name).exists(), name
    rows = read_metrics(folder / "metrics.jsonl")
    assert any("charts/episodic_return" in r for r in rows)
    assert any("losses/td_loss" in r and "charts/SPS" in r for r in rows)
    assert json.loads((folder / "summary.json").read_text())["train_steps"] == 100


def test_resume_continues_from_the_checkpoint(tmp_path):
    first = train(Config(**SMOKE, run_dir=str(tmp_path), run_name="a"), log=lambda _: None)
    ckpt = tmp_path / "a" / "checkpoint.pt"
    resumed = train(
        Config(**{**SMOKE, "total_steps": 1000}, run_dir=str(tmp_path), run_name="b", resume=str(ckpt)),
        log=lambda _: None,
    )
    assert resumed.env_steps == 1000 and resumed.train_steps == 200
    assert resumed.episodes > first.episodes  # the episode history came along
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    assert state["agent"]["counters"].tolist() == [1000.0, 200.0]


def test_prioritized_and_uniform_draw_different_batches(tmp_path):
    a = train(Config(**SMOKE, run_dir=str(tmp_path), run_name="p"), log=lambda _: None)
    b = train(Config(**SMOKE, run_dir=str(tmp_path), run_name="u", sampling="uniform"), log=lambda _: None)
    assert a.env_steps == b.env_steps
    pa = torch.load(tmp_path / "p" / "checkpoint.pt", weights_only=False)["agent"]["qnet"]
    pb = torch.load(tmp_path / "u" / "checkpoint.pt", weights_only=False)["agent"]["qnet"]
    assert any(not torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.parametrize("sampling", ["rank", "stratified"])
def test_other_sampling_modes_train(tmp_path, sampling):
    results = train(Config(**SMOKE, run_dir=str(tmp_path), sampling=sampling), log=lambda _: None)
    assert results.train_steps == 100 and results.episodes > 0


def test_same_seed_same_run(tmp_path):
    a = train(Config(**SMOKE, run_dir=str(tmp_path), run_name="x"), log=lambda _: None)
    b = train(Config(**SMOKE, run_dir=str(tmp_path), run_name="y"), log=lambda _: None)
    assert a.mean_return_last100 == b.mean_return_last100
    pa = torch.load(tmp_path / "x" / "checkpoint.pt", weights_only=False)["agent"]["qnet"]
    pb = torch.load(tmp_path / "y" / "checkpoint.pt", weights_only=False)["agent"]["qnet"]
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def test_market_smoke_training_evaluates_on_held_out_prices(tmp_path):
    cfg = Config(
        **{
            **SMOKE,
            "env": "market",
            "num_envs": 4,
            "episode_len": 32,
            "hidden": (32,),
            "bars": 5000,
            "test_bars": 1000,
        },
        run_dir=str(tmp_path),
    )
    results = train(cfg, log=lambda _: None)
    ev = results.evaluation
    assert ev is not None and {"total_log_pnl", "buy_and_hold_log_pnl", "flat_log_pnl"} <= set(ev)
    assert ev["flat_log_pnl"] == 0.0 and ev["bars"] > 100


def test_gymnasium_env_trains(tmp_path):
    pytest.importorskip("gymnasium")
    results = train(Config(**{**SMOKE, "env": "gym:CartPole-v1"}, run_dir=str(tmp_path)), log=lambda _: None)
    assert results.env_steps == 600 and results.train_steps == 100 and results.episodes > 0


def test_train_command_line(tmp_path, capsys):
    from gper.cli import main

    argv = ["train", "--device", "cpu", "--total-steps", "300", "--learning-starts", "100", "--batch-size", "16"]
    argv += ["--buffer-size", "500", "--epoch-steps", "100", "--hidden", "8", "--progress", "False"]
    argv += ["--run-dir", str(tmp_path), "--run-name", "cli"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "gper train: done" in out and '"env_steps": 300' in out
    assert (tmp_path / "cli" / "plot.png").exists()


def test_train_command_line_reports_bad_settings(capsys):
    from gper.cli import main

    assert main(["train", "--device", "cpu", "--batch-size", "0", "--progress", "False"]) == 2
    assert "batch_size must be an integer >= 1" in capsys.readouterr().out


def test_bench_train_on_cpu(tmp_path):
    from gper.bench.train_step import TrainBenchConfig, run_train_bench, step_flops

    rows = run_train_bench(
        TrainBenchConfig(
            device=CPU, capacity=1024, batch=64, hidden=(16,), precisions=("fp32",), steps=3, repeats=1, out=tmp_path
        ),
        log=lambda _: None,
    )
    modes = [r["mode"] for r in rows]
    assert modes == ["replay, one graph", "fixed batch, one graph", "replay, by phase", "replay, eager"]
    assert all(r["ms_per_step"] > 0 for r in rows)
    assert (
        len(list(tmp_path.glob("train-step-cpu-*.csv"))) == 1 and len(list(tmp_path.glob("train-step-cpu-*.md"))) == 1
    )
    # 51 -> 512 -> 512 -> 45 at 16384: 3 forwards + a backward of about 2 forwards, 2 FLOPs per MAC
    macs = 51 * 512 + 512 * 512 + 512 * 45
    assert step_flops(51, (512, 512), 45, 16384) == 2 * 16384 * (3 * macs + 2 * macs - 51 * 512)

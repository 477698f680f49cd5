"""The run's report: the phase line, the 100-episode windows and the solve point, the metrics."""

from __future__ import annotations

import math
import time

import pytest
import torch

from gper.dqn import Config, resolve
from gper.dqn.agent import N_SUMS, SUM_ABS_TD, SUM_LOSS, SUM_Q
from gper.dqn.algorithm import LOSS_METRICS, PHASE_ORDER
from gper.training.report import RunReport, busy_fraction, format_phase_line
from gper.training.runlog import RunLog, read_metrics

CPU = torch.device("cpu")


def test_phase_line_format():
    summary = {
        "per_sample": (0.02, 178),
        "upload": (0.01, 178),
        "fwd_bwd": (0.90, 178),
        "adam": (0.10, 178),
        "per_update": (0.01, 178),
    }
    line = format_phase_line(summary, torch.device("cuda"), PHASE_ORDER)
    assert line == (
        "GPU phase timing (178 batches avg): per_sample=0.02ms upload=0.01ms fwd_bwd=0.90ms adam=0.10ms "
        "per_update=0.01ms total=1.04ms"
    )
    with_collect = format_phase_line({**summary, "collect": (0.05, 40)}, CPU, PHASE_ORDER)
    assert with_collect.startswith("CPU phase timing (178 batches avg)")
    assert with_collect.endswith("| collect=0.050ms (40 collections avg)")
    assert format_phase_line({"collect": (0.05, 40)}, CPU) == (
        "CPU phase timing: no training steps yet (learning starts later) | collect=0.050ms (40 collections avg)"
    )


def test_busy_fraction_is_phase_time_over_wall_time_on_cuda_only():
    phases = {"collect": (1.0, 10), "fwd_bwd": (2.0, 10), "adam": (1.0, 10)}
    assert busy_fraction(phases, collects=100, trains=50, wall=0.5, cuda=True) == (1.0 * 100 + 3.0 * 50) / 1e3 / 0.5
    assert busy_fraction(phases, 100, 50, 0.5, cuda=False) is None
    assert busy_fraction({"fwd_bwd": (2.0, 10)}, 100, 50, 0.5, cuda=True) is None


def test_epoch_report_windows_solve_point_and_loss_metrics(tmp_path, smoke):
    cfg = resolve(Config(**smoke, solve_return=6.0), CPU)
    runlog = RunLog(tmp_path / "run")
    lines: list[str] = []
    report = RunReport(cfg, CPU, runlog, [1.0] * 60, lines.append, LOSS_METRICS)  # 60 episodes from before a resume
    report.start(t0=0.0, sums=torch.zeros(N_SUMS, dtype=torch.float64), train_steps=5)
    sums = torch.zeros(N_SUMS, dtype=torch.float64)
    sums[SUM_LOSS], sums[SUM_Q], sums[SUM_ABS_TD] = 4.0, 8.0, 2.0
    # 60 more episodes: 20 returns of 1, then 40 of 20 (episodes 81 to 120); the window of the last
    # 100 ending at episode k has mean (19 (k - 80) + 100) / 100: 4.8 at k = 100, first >= 6 at
    # k = 107 (6.13), 8.6 at k = 120
    episodes = [(1.0 if i < 20 else 20.0, 9, 1000 + i) for i in range(60)]
    host = {"sums": sums, "beta": torch.tensor(0.5)}
    common = dict(env_step=1200, iterations=300, charts={"charts/epsilon": 0.3, "charts/beta": 0.5}, now=2.0)
    metrics = report.end_epoch(host, episodes, 0, train_steps=9, phases={}, **common)
    assert len(report.returns) == 120
    assert report.best == pytest.approx(8.6)
    assert report.solved_at == (1000 + 106 - 60, 2.0)  # episode 107 is the 47th of this epoch
    assert metrics["losses/td_loss"] == 1.0 and metrics["losses/q_values"] == 2.0 and metrics["losses/abs_td"] == 0.5
    assert metrics["charts/SPS"] == 300 * cfg.num_envs / 2.0 and metrics["charts/train_steps_per_s"] == 4 / 2.0
    assert metrics["charts/beta"] == 0.5 and metrics["charts/epsilon"] == 0.3
    assert math.isclose(metrics["charts/mean_return_last100"], sum(report.returns[-100:]) / 100)
    assert lines[0] == "CPU phase timing: no steps timed" and lines[1].startswith("step      1200  return(last100)")
    runlog.close()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == 61 and rows[-1]["global_step"] == 1200 and rows[0]["charts/episodic_length"] == 9
    results = report.results(1200, 9, 3.0, None, ["a note"])
    assert results.episodes == 120 and results.solved_at_step == report.solved_at[0] and results.notes == ["a note"]
    assert results.best_mean_return_last100 == report.best and results.phase_ms == {}


def test_the_first_epoch_after_a_resume_inside_it_rates_only_its_own_steps(tmp_path, smoke):
    """Resumed at 5 training steps inside an epoch that began at 2: the epoch's losses are the whole
    epoch's (7 steps), its rates those of the 4 steps this run took in its 2 seconds."""
    cfg = resolve(Config(**smoke), CPU)
    before = RunReport(cfg, CPU, RunLog(tmp_path / "before"), [], lambda _: None)
    before.start(t0=time.perf_counter(), sums=torch.zeros(N_SUMS, dtype=torch.float64), train_steps=2)
    state = before.state_dict()  # the checkpoint inside the epoch: its start's sums and steps
    before.runlog.close()
    report = RunReport(cfg, CPU, RunLog(tmp_path / "run"), [], lambda _: None, LOSS_METRICS)
    report.start(t0=0.0, sums=torch.zeros(N_SUMS, dtype=torch.float64), train_steps=5)
    report.load_state_dict(state)
    sums = torch.zeros(N_SUMS, dtype=torch.float64)
    sums[SUM_LOSS] = 7.0
    host = {"sums": sums, "beta": torch.tensor(0.5)}
    common = dict(env_step=1200, iterations=300, charts={}, phases={})
    metrics = report.end_epoch(host, [], 0, train_steps=9, now=2.0, **common)
    assert metrics["losses/td_loss"] == 1.0
    assert metrics["charts/train_steps_per_s"] == 4 / 2.0 and metrics["charts/SPS"] == 300 * cfg.num_envs / 2.0
    sums = sums.clone()
    sums[SUM_LOSS] = 10.0
    later = report.end_epoch(host | {"sums": sums}, [], 0, train_steps=12, now=5.0, **common)
    assert later["losses/td_loss"] == 1.0 and later["charts/train_steps_per_s"] == 3 / 3.0
    report.runlog.close()


def _evaluation(mean: float) -> dict[str, float]:
    return {"eval/mean_return": mean, "eval/std_return": 1.0, "eval/episodes": 10, "eval/seconds": 0.01}


def test_the_report_state_carries_the_clock_and_the_evaluations(tmp_path, smoke):
    """A resumed run's report goes on from the checkpoint's: its clock counts the wall time already
    spent, the last and best evaluations come along; a checkpoint from before these entries loads."""
    cfg = resolve(Config(**smoke), CPU)
    zeros = torch.zeros(N_SUMS, dtype=torch.float64)
    report = RunReport(cfg, CPU, RunLog(tmp_path / "a"), [], lambda _: None)
    report.start(t0=time.perf_counter(), sums=zeros, train_steps=0)
    report.end_evaluation(400, _evaluation(30.0), now=time.perf_counter())
    report.end_evaluation(800, _evaluation(20.0), now=time.perf_counter())
    state = {**report.state_dict(), "wall": 100.0}
    lines: list[str] = []
    resumed = RunReport(cfg, CPU, RunLog(tmp_path / "b"), [], lines.append)
    resumed.start(t0=time.perf_counter(), sums=zeros, train_steps=0)
    resumed.load_state_dict(state)
    assert 100.0 <= resumed.state_dict()["wall"] < 110.0
    results = resumed.results(800, 0, 100.0, None, [])
    assert (results.eval_at_step, results.eval_mean_return, results.best_eval_mean_return) == (800, 20.0, 30.0)
    resumed.end_evaluation(1200, _evaluation(40.0), now=time.perf_counter())
    assert lines == ["eval      1200  greedy return    40.00 ± 1.00  (10 episodes, 0.01s)"]
    assert resumed.results(1200, 0, 1.0, None, [], stopped="SIGINT").stopped == "SIGINT"
    older = RunReport(cfg, CPU, RunLog(tmp_path / "c"), [], lambda _: None)
    older.start(t0=time.perf_counter(), sums=zeros, train_steps=0)
    older.load_state_dict({k: state[k] for k in ("best", "solved_at", "epoch_sums", "epoch_train_steps")})
    assert older.state_dict()["wall"] < 10.0 and older.results(0, 0, 0.0, None, []).eval_mean_return is None

"""A run's record across stops and resumes, in process on the CPU: a stopped run writes its summary
and plot; a resumed one continues metrics.jsonl, TensorBoard, the best window, the solve point,
the episode count and the evaluations, and ends with the record of the run never stopped."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from gper.dqn import Config, train
from gper.training import epochs
from gper.training.checkpoints import list_checkpoints, step_of
from gper.training.runlog import read_metrics
from gper.training.tensorboard import event_files
from helpers import assert_same_training, computed_records, event_scalars, jsonl_scalars, run_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = dict(log=lambda _: None)

#: what summary.json says about the run's course (not its times)
COURSE = (
    "env_steps",
    "train_steps",
    "episodes",
    "mean_return_last100",
    "best_mean_return_last100",
    "solved_at_step",
    "eval_mean_return",
    "eval_at_step",
    "best_eval_mean_return",
    "stopped",
)


@pytest.fixture
def run(smoke, tmp_path):
    """2400 env steps in 6 epochs of 100 iterations (4 envs), about 240 episodes, the 100-episode
    mean first at 10.5 after about 1500 steps; an evaluation every 2 epochs, a checkpoint every 2."""
    return dict(
        smoke,
        total_steps=2400,
        epoch_steps=400,
        solve_return=10.5,
        eval_every=2,
        checkpoint_every=2,
        keep_checkpoints=10,
        run_dir=str(tmp_path),
    )


def _summary(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _stop_at(monkeypatch, sig: int, iteration: int) -> None:
    """Send ``sig`` to this process during collection iteration ``iteration``."""
    step = epochs.step_iteration

    def step_then_signal(cfg, agent, it, timer, train_steps):
        trained = step(cfg, agent, it, timer, train_steps)
        if it == iteration:
            signal.raise_signal(sig)
        return trained

    monkeypatch.setattr(epochs, "step_iteration", step_then_signal)


@pytest.mark.parametrize("iteration", [329, 399], ids=["inside an epoch", "at an epoch's end"])
def test_a_stopped_run_writes_its_record_and_a_resumed_one_ends_with_the_whole_runs(
    run, tmp_path, monkeypatch, iteration
):
    """Stopped by SIGINT inside epoch 4 (at env step 1320) or at its end (1600, after the epoch's
    evaluation): summary.json says so and where, plot.png is there. Resumed, the run's summary,
    metrics.jsonl (but for the times) and TensorBoard scalars are those of the run never stopped."""
    whole = train(Config(**run, run_name="whole"), **QUIET)
    assert whole.solved_at_step is not None and whole.episodes > 100 and whole.eval_at_step == 2400
    _stop_at(monkeypatch, signal.SIGINT, iteration)
    lines = []
    with pytest.raises(KeyboardInterrupt):
        train(Config(**run, run_name="stopped"), log=lines.append)
    monkeypatch.undo()
    folder, reached = tmp_path / "stopped", 4 * (iteration + 1)
    stopped = _summary(folder)
    assert stopped["stopped"] == "SIGINT" and stopped["env_steps"] == reached
    assert stopped["episodes"] == sum("charts/episodic_return" in r for r in computed_records(folder))
    assert (folder / "plot.png").stat().st_size > 10_000
    assert lines[-1] == (
        f"gper train: SIGINT: stopped after writing {folder / 'checkpoints' / f'step-{reached:012d}'}; "
        f"continue with --resume {folder}"
    )
    assert [step_of(p) for p in list_checkpoints(folder / "checkpoints")][-1] == reached

    stopped_wall = run_checkpoint(folder)[0]["report"]["wall"]
    resumed = train(Config(**run, resume=str(folder)), **QUIET)
    assert_same_training(tmp_path / "whole", folder)
    assert {k: _summary(folder)[k] for k in COURSE} == {k: _summary(tmp_path / "whole")[k] for k in COURSE}
    assert resumed.wall_s > stopped_wall  # the clock went on from the checkpoint's
    assert computed_records(folder) == computed_records(tmp_path / "whole")
    assert len(event_files(folder)) == 1  # rewritten from metrics.jsonl on resume
    assert event_scalars(folder) == jsonl_scalars(folder)


def test_a_run_resumed_in_another_folder_holds_the_whole_record(run, tmp_path):
    """From a checkpoint of another run folder, the new folder's metrics.jsonl and event file start
    with what that folder held at the checkpoint."""
    train(Config(**run, run_name="whole"), **QUIET)
    middle = tmp_path / "whole" / "checkpoints" / "step-000000000800"
    train(Config(**run, run_name="branch", resume=str(middle)), **QUIET)
    branch = tmp_path / "branch"
    assert computed_records(branch) == computed_records(tmp_path / "whole")
    assert event_scalars(branch) == jsonl_scalars(branch)
    assert {k: _summary(branch)[k] for k in COURSE} == {k: _summary(tmp_path / "whole")[k] for k in COURSE}


def test_the_event_file_holds_what_metrics_jsonl_holds(run, tmp_path):
    """CleanRL's names, at the same steps, with the same values (as float32), and the settings."""
    train(Config(**run, run_name="a"), **QUIET)
    scalars = event_scalars(tmp_path / "a")
    assert scalars == jsonl_scalars(tmp_path / "a")
    expected = {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "losses/td_loss"}
    assert expected | {"losses/q_values", "charts/epsilon", "eval/mean_return", "timing/fwd_bwd_ms"} <= set(scalars)
    assert [step for step, _ in scalars["eval/mean_return"]] == [800, 1600, 2400]


def test_without_tensorboard_event_files_are_off_unless_asked_for(run, tmp_path, monkeypatch):
    """Without the tensorboard package a run writes no event files and says nothing of them; one
    that asks for them (--tensorboard True) gets one line saying how to get them or turn them off."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert Config().tensorboard is False
    lines = []
    results = train(Config(**{**run, "total_steps": 800}, run_name="a"), log=lines.append)
    assert results.env_steps == 800 and not event_files(tmp_path / "a")
    assert not [line for line in lines if "tensorboard" in line.lower()]
    lines.clear()
    train(Config(**{**run, "total_steps": 800, "tensorboard": True}, run_name="b"), log=lines.append)
    assert not event_files(tmp_path / "b")
    assert [line for line in lines if "tensorboard" in line.lower()] == [
        'gper train: no TensorBoard event files: they need tensorboard: pip install ".[tensorboard]", '
        "or --tensorboard False"
    ]


def test_event_files_are_on_by_default_where_tensorboard_is_installed():
    pytest.importorskip("tensorboard")
    assert Config().tensorboard is True


def test_without_save_a_stop_still_writes_the_summary_and_plot(run, tmp_path, monkeypatch):
    _stop_at(monkeypatch, signal.SIGTERM, 130)
    lines = []
    with pytest.raises(SystemExit) as info:
        train(Config(**run, run_name="a", save=False), log=lines.append)
    assert info.value.code == 128 + signal.SIGTERM
    folder = tmp_path / "a"
    assert _summary(folder)["stopped"] == "SIGTERM" and _summary(folder)["env_steps"] == 524
    assert (folder / "plot.png").exists() and not (folder / "checkpoints").exists()
    assert lines[-1] == "gper train: SIGTERM: stopped at env step 524 (save is off: no checkpoint)"


def test_a_stop_during_the_market_evaluation_ends_it_with_the_record(smoke, tmp_path, monkeypatch):
    """The held-out walk after the last epoch checks for a stop signal at every bar: stopped there,
    the run writes its summary (no evaluation, stopped) after its final checkpoint."""
    import gper.envs.market

    evaluate = gper.envs.market.evaluate

    def signal_then_evaluate(policy, source):
        signal.raise_signal(signal.SIGINT)
        return evaluate(policy, source)

    monkeypatch.setattr(gper.envs.market, "evaluate", signal_then_evaluate)
    market = dict(env="market", num_envs=4, episode_len=32, hidden=(32,), bars=5000, test_bars=1000)
    with pytest.raises(KeyboardInterrupt):
        train(Config(**{**smoke, **market}, run_dir=str(tmp_path), run_name="m"), **QUIET)
    summary = _summary(tmp_path / "m")
    assert summary["stopped"] == "SIGINT" and summary["evaluation"] is None and summary["env_steps"] == 600
    assert [step_of(p) for p in list_checkpoints(tmp_path / "m" / "checkpoints")] == [600]


def test_the_report_lookahead_leaves_the_record_as_it_was(run, tmp_path, monkeypatch):
    """The next epoch's first iterations launched before an epoch's report (where no evaluation or
    checkpoint is due: after epochs 1, 3 and 5 here) change no record: summary and metrics.jsonl
    as with no lookahead."""
    run = dict(run, checkpoint_every=0)
    reported = []  # (the epoch's end, the iterations launched when it was reported)
    launched = [0]
    iterations, report_epoch = epochs.EpochLoop._iterations, epochs.EpochLoop._report_epoch

    def counting(self, it, end, pause=None):
        done = iterations(self, it, end, pause)
        launched[0] = done[0]
        return done

    def noting(self, closed):
        reported.append((closed.end, launched[0]))
        return report_epoch(self, closed)

    monkeypatch.setattr(epochs.EpochLoop, "_iterations", counting)
    monkeypatch.setattr(epochs.EpochLoop, "_report_epoch", noting)
    train(Config(**run, run_name="ahead"), **QUIET)
    assert reported == [(100, 199), (200, 200), (300, 399), (400, 400), (500, 599), (600, 600)]
    monkeypatch.setattr(epochs, "REPORT_LOOKAHEAD", 0)
    reported.clear()
    train(Config(**run, run_name="plain"), **QUIET)
    assert reported == [(end, end) for end in range(100, 700, 100)]
    assert computed_records(tmp_path / "ahead") == computed_records(tmp_path / "plain")
    assert {k: _summary(tmp_path / "ahead")[k] for k in COURSE} == {k: _summary(tmp_path / "plain")[k] for k in COURSE}


def test_the_report_lookahead_runs_the_blocks_of_iterations_the_epoch_runs_without_it(run, tmp_path, monkeypatch):
    """With graph_iterations, the lookahead pauses at a block's end, and the epoch goes on in the
    blocks it runs without a lookahead (on CUDA each block is its own graph: the same graphs)."""
    run = dict(run, checkpoint_every=0, graph_iterations=5, time_every=0)  # 100-iteration epochs: 20 blocks
    steps, block = [], epochs.EpochLoop._block

    def noting(self, i, end):
        done = block(self, i, end)
        steps.append((i, done))
        return done

    monkeypatch.setattr(epochs.EpochLoop, "_block", noting)
    train(Config(**run, run_name="ahead"), **QUIET)
    ahead = list(steps)
    monkeypatch.setattr(epochs, "REPORT_LOOKAHEAD", 0)
    steps.clear()
    train(Config(**run, run_name="plain"), **QUIET)
    assert ahead == steps and (195, 5) in steps
    assert computed_records(tmp_path / "ahead") == computed_records(tmp_path / "plain")


def test_a_stop_during_the_lookahead_is_seen_after_the_epochs_report(run, tmp_path, monkeypatch):
    """SIGINT at iteration 329, inside the lookahead after epoch 3 (which ended at 300 with no
    evaluation or checkpoint due): the lookahead stops at 330, epoch 3 is reported, then the
    checkpoint of iteration 330 and the report of the epoch so far."""
    ahead, look_ahead = [], epochs.EpochLoop._look_ahead

    def noting(self, end, epoch, iterations, epoch_its):
        ahead.append(look_ahead(self, end, epoch, iterations, epoch_its))
        return ahead[-1]

    monkeypatch.setattr(epochs.EpochLoop, "_look_ahead", noting)
    _stop_at(monkeypatch, signal.SIGINT, 329)
    with pytest.raises(KeyboardInterrupt):
        train(Config(**run, run_name="stopped"), **QUIET)
    assert ahead == [(199, False), (200, False), (330, True)]  # after epoch 2 an evaluation is due: none
    folder = tmp_path / "stopped"
    assert _summary(folder)["env_steps"] == 1320 and step_of(list_checkpoints(folder / "checkpoints")[-1]) == 1320
    steps = [row["global_step"] for row in read_metrics(folder / "metrics.jsonl") if "charts/SPS" in row]
    assert steps == [400, 800, 1200, 1320]  # epoch 3's report, then the epoch so far

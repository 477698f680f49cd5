"""TensorBoard event files beside metrics.jsonl, read back with TensorBoard's own EventAccumulator:
the same names, steps and values; a record continued from a checkpoint shows no step twice."""

from __future__ import annotations

import sys
import time

import pytest

from gper.training.runlog import RunLog, read_metrics
from gper.training.tensorboard import event_files
from helpers import event_scalars, jsonl_scalars


def _epoch(log: RunLog, step: int, value: float) -> None:
    """Two episodes and an epoch record ending at ``step``, as the trainer writes them."""
    log.log(step - 7, **{"charts/episodic_return": value, "charts/episodic_length": 7})
    log.log(step - 3, **{"charts/episodic_return": value + 0.5, "charts/episodic_length": 4})
    log.log(step, **{"charts/SPS": 1e3 + value, "losses/td_loss": 0.1 / (1 + value), "eval/mean_return": float("nan")})


def test_the_event_file_holds_the_records_of_metrics_jsonl(tmp_path):
    log = RunLog(tmp_path)
    log.open_events({"hyperparameters": "|setting|value|\n|-|-|\n|seed|1|"})
    for k in range(1, 6):
        _epoch(log, 10 * k, float(k) / 3)
    log.close()
    scalars = event_scalars(tmp_path)
    assert scalars == jsonl_scalars(tmp_path)
    assert set(scalars) == {"charts/episodic_return", "charts/episodic_length", "charts/SPS", "losses/td_loss"}
    assert [s for s, _ in scalars["charts/SPS"]] == [10, 20, 30, 40, 50]
    assert scalars["losses/td_loss"][0] == (10, pytest.approx(0.1 / (4 / 3), rel=1e-7))  # float32
    assert "eval/mean_return" not in scalars  # NaN: null in metrics.jsonl, nothing in TensorBoard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert "hyperparameters/text_summary" in acc.Tags()["tensors"]


def test_a_record_continued_from_a_checkpoint_shows_no_step_twice(tmp_path):
    """A run wrote epochs 1-5, its checkpoint recorded the length of metrics.jsonl after epoch 3,
    it died after epoch 5; the resumed run writes epochs 4-6 again (other values: what TensorBoard
    shows must be the new ones). The event files are rewritten from metrics.jsonl, cut back to step 30."""
    log = RunLog(tmp_path)
    log.open_events()
    for k in range(1, 4):
        _epoch(log, 10 * k, float(k))
    at_checkpoint = log.metrics_bytes()
    for k in range(4, 6):
        _epoch(log, 10 * k, float(k))
    log.close()
    log = RunLog(tmp_path, metrics_bytes=at_checkpoint)
    log.open_events()
    for k in range(4, 7):
        _epoch(log, 10 * k, 100.0 + k)
    log.close()
    assert len(event_files(tmp_path)) == 1
    scalars = event_scalars(tmp_path)
    assert scalars == jsonl_scalars(tmp_path)
    assert [s for s, _ in scalars["charts/SPS"]] == [10, 20, 30, 40, 50, 60]
    assert [v for _, v in scalars["charts/SPS"]][3:] == [1104.0, 1105.0, 1106.0]


def test_a_record_without_event_files_or_in_another_folder_writes_its_history_first(tmp_path):
    """Continued in place where no event file exists yet (tensorboard was missing or off), or in
    another folder from a checkpoint of this one: the event file starts with the records so far."""
    log = RunLog(tmp_path / "a")
    for k in range(1, 4):
        _epoch(log, 10 * k, float(k))
    at_checkpoint = log.metrics_bytes()
    _epoch(log, 40, 4.0)
    log.close()
    for folder, history in ((tmp_path / "b", tmp_path / "a" / "metrics.jsonl"), (tmp_path / "a", None)):
        log = RunLog(folder, metrics_bytes=at_checkpoint, history=history)
        log.open_events()
        _epoch(log, 40, 40.0)
        log.close()
        assert event_scalars(folder) == jsonl_scalars(folder), folder
        assert [r["global_step"] for r in read_metrics(folder / "metrics.jsonl")][-4:] == [30, 33, 37, 40]
    assert read_metrics(tmp_path / "a" / "metrics.jsonl") == read_metrics(tmp_path / "b" / "metrics.jsonl")


def test_a_new_record_replaces_an_earlier_runs_files(tmp_path):
    log = RunLog(tmp_path)
    log.open_events()
    _epoch(log, 10, 1.0)
    log.close()
    log = RunLog(tmp_path)  # a run that left no checkpoints here, and a new one in its folder
    log.open_events()
    _epoch(log, 20, 2.0)
    log.close()
    assert len(event_files(tmp_path)) == 1
    assert [s for s, _ in event_scalars(tmp_path)["charts/SPS"]] == [20]
    assert [r["global_step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [13, 17, 20]


def test_a_record_continued_after_a_stretch_without_event_files_holds_every_step(tmp_path):
    """Event files on, then a resumed stretch with them off, then on again: TensorBoard shows every
    epoch of metrics.jsonl, the stretch's too."""
    log = RunLog(tmp_path)
    log.open_events()
    _epoch(log, 10, 1.0)
    log.close()
    for step, events in ((20, False), (30, True)):
        log = RunLog(tmp_path, metrics_bytes=(tmp_path / "metrics.jsonl").stat().st_size)
        if events:
            log.open_events()
        _epoch(log, step, step / 10)
        log.close()
    assert [s for s, _ in event_scalars(tmp_path)["charts/SPS"]] == [10, 20, 30]
    assert event_scalars(tmp_path) == jsonl_scalars(tmp_path)


def test_an_event_file_named_in_the_future_does_not_hold_up_a_resume(tmp_path):
    """A folder copied from a machine whose clock ran ahead: its file sorts after any new one."""
    log = RunLog(tmp_path)
    log.open_events()
    _epoch(log, 10, 1.0)
    log.close()
    (old,) = event_files(tmp_path)
    future = old.with_name(f"events.out.tfevents.{int(time.time()) + 10**8}.host.1.0")
    old.rename(future)
    started = time.monotonic()
    log = RunLog(tmp_path, metrics_bytes=(tmp_path / "metrics.jsonl").stat().st_size)
    log.open_events()
    _epoch(log, 20, 2.0)
    log.close()
    assert time.monotonic() - started < 5 and not future.exists()
    assert [s for s, _ in event_scalars(tmp_path)["charts/SPS"]] == [10, 20]


def test_without_tensorboard_an_event_log_cannot_open(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    log = RunLog(tmp_path)
    with pytest.raises(ImportError, match="TensorBoard event files need the tensorboard package"):
        log.open_events()
    log.log(1, **{"charts/SPS": 1.0})  # the record goes on without them
    log.close()
    assert event_files(tmp_path) == [] and len(read_metrics(tmp_path / "metrics.jsonl")) == 1

"""RunLog and plot_run: the run folder's metrics.jsonl and plot."""

from __future__ import annotations

import pytest

from gper.training.plot import plot_run
from gper.training.runlog import RunLog, read_metrics


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


def test_a_resumed_runlog_drops_the_records_after_its_checkpoint(tmp_path):
    log = RunLog(tmp_path)
    log.log(10, **{"charts/SPS": 1.0})
    at_checkpoint = log.metrics_bytes()
    log.log(20, **{"charts/SPS": 2.0})  # written by a run that then died before its next checkpoint
    log.close()
    log = RunLog(tmp_path, metrics_bytes=at_checkpoint)
    log.log(20, **{"charts/SPS": 3.0})
    log.close()
    assert [r["charts/SPS"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0, 3.0]


def test_write_json_replaces_the_file_whole(tmp_path):
    log = RunLog(tmp_path)
    log.write_json("config.json", {"a": 1})
    log.write_json("config.json", {"a": 2})
    log.close()
    assert (tmp_path / "config.json").read_text() == '{\n  "a": 2\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "metrics.jsonl"]


def test_log_episodes_writes_what_log_writes(tmp_path):
    """The episodes' fast path: the same lines as log() a record at a time, non-finite returns as null."""
    records = [(5, "agent_0/r", 9.0, "agent_0/l", 9), (7, "charts/r", 0.1 + 0.2, "charts/l", 12)]
    records += [(9, "a/r", float("nan"), "a/l", 3), (9, "a/r", -float("inf"), "a/l", 4), (11, "b/r", -1e-300, "b/l", 0)]
    one, many = RunLog(tmp_path / "one"), RunLog(tmp_path / "many")
    for step, rn, r, ln, n in records:
        one.log(step, **{rn: r, ln: n})
    many.log_episodes(iter(records))
    one.close(), many.close()
    assert (tmp_path / "one" / "metrics.jsonl").read_text() == (tmp_path / "many" / "metrics.jsonl").read_text()


@pytest.mark.parametrize("odd", [None, float("nan")], ids=["finite", "a-nan-return"])
def test_log_agent_episodes_writes_what_log_writes(tmp_path, odd):
    """A population's episodes from columns: the lines log() writes a record at a time (the general
    path where a return is not finite)."""
    steps, agents, returns, lengths = [5, 5, 7, 9], [0, 12, 3, 0], [9.0, 0.1 + 0.2, -1e-300, 22.5], [9, 12, 0, 3]
    if odd is not None:
        returns[2] = odd
    one, cols = RunLog(tmp_path / "one"), RunLog(tmp_path / "cols")
    for s, a, r, n in zip(steps, agents, returns, lengths, strict=True):
        one.log(s, **{f"agent_{a}/charts/episodic_return": r, f"agent_{a}/charts/episodic_length": n})
    cols.log_agent_episodes(steps, agents, returns, lengths)
    cols.log_agent_episodes([], [], [], [])
    one.close(), cols.close()
    assert (tmp_path / "one" / "metrics.jsonl").read_text() == (tmp_path / "cols" / "metrics.jsonl").read_text()

"""RunLog and plot_run: the run folder's metrics.jsonl and plot."""

from __future__ import annotations

from gper.training.runlog import RunLog, plot_run, read_metrics


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

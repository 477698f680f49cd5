"""plot_run: the return panel (episodes, their 100-episode mean, the greedy evaluations, the solved
threshold and where it was reached), the losses and the phase times."""

from __future__ import annotations

import pytest

from gper.training.plot import figure, plot_run
from gper.training.runlog import RunLog, read_metrics


def _run(folder):
    """200 episodes, 100 of return 10 then 100 of 100: the mean of the last 100 after episode
    100 + k is 10 + 0.9 k, which first reaches 50 at k = 45, at env step 1450."""
    log = RunLog(folder)
    for i in range(200):
        ret = 10.0 if i < 100 else 100.0
        log.log(10 * (i + 1), **{"charts/episodic_return": ret, "charts/episodic_length": int(ret)})
        if (i + 1) % 50 == 0:
            step = 10 * (i + 1)
            log.log(step, **{"losses/td_loss": 1.0 / (i + 1), "losses/q_values": i / 10, "timing/fwd_bwd_ms": 0.5})
            log.log(step, **{"eval/mean_return": ret * 2, "eval/std_return": 3.0, "eval/episodes": 10})
    log.close()
    return read_metrics(folder / "metrics.jsonl")


def test_the_return_panel_marks_the_threshold_the_evaluations_and_the_solve_point(tmp_path):
    fig = figure(_run(tmp_path), title="cartpole", solve_return=50.0)
    ret, loss, timing, q = fig.axes  # the Q-value axis, a twin of the loss axis, comes last
    assert ret.get_title() == "cartpole: return"
    lines = {line.get_label(): line for line in ret.lines}
    assert list(lines["solved: 50"].get_ydata()) == [50.0, 50.0]
    assert list(lines["mean of last 100 reached it: 1,450"].get_xdata()) == [1450, 1450]
    assert list(lines["mean of last 100"].get_ydata())[143:145] == pytest.approx([49.6, 50.5])
    (evals,) = ret.containers  # the error bars of the evaluations
    assert list(evals.lines[0].get_xdata()) == [500, 1000, 1500, 2000]
    assert list(evals.lines[0].get_ydata()) == [20.0, 20.0, 200.0, 200.0]
    assert "10 episodes" in evals.get_label()
    assert loss.get_yscale() == "log" and list(loss.lines[0].get_ydata()) == [1 / 50, 1 / 100, 1 / 150, 1 / 200]
    assert list(q.lines[0].get_ydata()) == [4.9, 9.9, 14.9, 19.9]
    assert [line.get_label() for line in timing.lines] == ["fwd_bwd"]


def test_without_a_threshold_or_evaluations_the_panels_leave_them_out(tmp_path):
    rows = [r for r in _run(tmp_path) if "eval/mean_return" not in r]
    ret = figure(rows).axes[0]
    assert [line.get_label() for line in ret.lines] == ["training episode", "mean of last 100"]
    assert not ret.containers
    assert [line.get_label() for line in figure(rows, solve_return=1000.0).axes[0].lines][-1] == "solved: 1000"


def test_published_scores_are_a_line_or_a_band(tmp_path):
    rows = _run(tmp_path)
    refs = [("published, one number", 80.0, 80.0), ("published, a range", 19.0, 20.0)]
    ret = figure(rows, solve_return=50.0, references=refs).axes[0]
    lines = {line.get_label(): line for line in ret.lines}
    assert list(lines["published, one number"].get_ydata()) == [80.0, 80.0]
    (band,) = [p for p in ret.patches if p.get_label() == "published, a range"]
    ys = band.get_patch_transform().transform(band.get_path().vertices)[:, 1]  # Rectangle or Polygon
    assert (min(ys), max(ys)) == (19.0, 20.0)
    assert {"published, one number", "published, a range"} <= set(ret.get_legend_handles_labels()[1])


@pytest.mark.parametrize("low, high", [(20.0, 19.0), (float("nan"), 1.0), (0.0, float("inf"))])
def test_a_reference_above_its_high_or_not_finite_is_refused_before_anything_is_drawn(tmp_path, low, high):
    rows = _run(tmp_path)
    with pytest.raises(ValueError, match="reference 'r'"):
        plot_run(tmp_path / "metrics.jsonl", tmp_path / "plot.png", references=[("r", low, high)])
    assert not (tmp_path / "plot.png").exists()
    with pytest.raises(ValueError, match="reference 'r'"):
        figure(rows, references=[("r", low, high)])


def test_references_given_as_an_iterator_are_all_drawn(tmp_path):
    refs = iter([("a", 1.0, 1.0), ("b", 2.0, 3.0)])
    labels = figure(_run(tmp_path), references=refs).axes[0].get_legend_handles_labels()[1]
    assert {"a", "b"} <= set(labels)


def test_plot_run_writes_the_png(tmp_path):
    _run(tmp_path)
    png = plot_run(tmp_path / "metrics.jsonl", tmp_path / "plot.png", title="t", solve_return=50.0)
    assert png == tmp_path / "plot.png" and png.stat().st_size > 10_000


def test_running_means_are_the_last_100_returns_mean():
    """The plotted window after each episode, against the plain definition (fewer than 100 at the start)."""
    from gper.training.plot import _running_means

    returns = [float((7 * i) % 23) - 5.5 for i in range(250)]
    want = [sum(returns[max(0, i - 99) : i + 1]) / min(i + 1, 100) for i in range(250)]
    got = _running_means(returns)
    assert len(got) == 250 and max(abs(g - w) for g, w in zip(got, want, strict=True)) < 1e-12
    assert _running_means([]) == []


def test_a_populations_agents_and_series_in_one_pass():
    from gper.training.plot import _agent_series, population_agents

    rows = [
        {"global_step": 10, "agent_3/charts/episodic_return": 1.0, "agent_3/charts/episodic_length": 4},
        {"global_step": 10, "agent_0/charts/episodic_return": 2.0},
        {"global_step": 20, "charts/SPS": 5.0, "agent_3/charts/mean_return_last100": 1.0},
        {"global_step": 30, "agent_3/charts/episodic_return": 3.0, "agent_12/charts/episodic_return": None},
    ]
    assert population_agents(rows) == [0, 3, 12]
    assert _agent_series(rows, [0, 3, 12]) == [([10], [2.0]), ([10, 30], [1.0, 3.0]), ([], [])]
    assert population_agents([{"global_step": 1, "charts/episodic_return": 1.0}]) == []

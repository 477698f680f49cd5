"""The walk-forward report: folds checked and joined in time order, the out-of-sample scores, the
files (report.json round trip, report.md's tables and sentence, equity.png with and without
matplotlib), the summary of several runs, and the modules' imports."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from gper.walkforward import FoldOutcome, Window, aggregate, aggregate_markdown, build_report, write_report
from gper.walkforward.baselines import BASELINES
from gper.walkforward.report import comparison_sentence, report_markdown, strategies
from gper.walkforward.scores import pnl_scores

DAY = 86_400 * 10**9
DAY0 = int(np.datetime64("2024-01-01", "ns").astype(np.int64))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _window(first_day: int, n: int) -> Window:
    return Window.of(DAY0 + np.arange(first_day, first_day + n, dtype=np.int64) * DAY)


def _fold(index: int, first_day: int, policy: list[float], hold: list[float], **chosen) -> FoldOutcome:
    """A fold whose test bars are daily from ``first_day`` (days after 2024-01-01), preceded by
    20 training days and 5 validation days; the policy trades 1 on its first bar, 0.5 after."""
    n = len(policy)
    return FoldOutcome(
        index=index,
        train=_window(first_day - 25, 20),
        val=_window(first_day - 5, 5),
        test=_window(first_day, n),
        chosen=chosen or {"epoch": index + 1, "env_step": 1000 * (index + 1), "val_sharpe": 0.05, "flat": False},
        time_ns=DAY0 + np.arange(first_day, first_day + n, dtype=np.int64) * DAY,
        policy_pnl=np.array(policy),
        policy_traded=np.array([1.0] + [0.5] * (n - 1)),
        hold_pnl=np.array(hold),
        hold_traded=np.array([1.0] + [0.0] * (n - 1)),
    )


def _two_folds() -> list[FoldOutcome]:
    # policy: cumulative 0.1, 0.3 in fold 0, then 0.2, 0.0, 0.05 in fold 1: the drawdown (0.3)
    # spans the boundary, deeper than either fold's own (0 and 0.3 - 0.2 = 0.1 from fold 1's start)
    return [
        _fold(0, 30, [0.1, 0.2], [0.05, 0.05]),
        _fold(1, 32, [-0.1, -0.2, 0.05], [0.1, -0.05, 0.2]),
    ]


def test_the_out_of_sample_period_joins_the_folds_test_bars():
    report = build_report(_two_folds(), {"series": "synthetic", "seed": 0})
    oos = report["out_of_sample"]
    assert (oos["start"], oos["end"], oos["bars"], oos["folds"]) == ("2024-01-31", "2024-02-04", 5, 2)
    # 5 daily bars: 4 one-day intervals
    assert oos["bars_per_year"] == pytest.approx(365.25)
    assert oos["policy"]["log_pnl"] == pytest.approx(0.05)
    assert oos["policy"]["max_drawdown"] == pytest.approx(0.3)
    assert oos["policy"]["turnover"] == pytest.approx(1 + 0.5 + 1 + 0.5 + 0.5)
    assert oos["buy_and_hold"]["log_pnl"] == pytest.approx(0.35)
    assert oos["buy_and_hold"]["turnover"] == 2.0  # entered once per fold
    assert {k: v for k, v in oos["flat"].items() if k != "empyrical"} == {
        "log_pnl": 0.0,
        "sharpe_per_bar": 0.0,
        "sharpe_annual": 0.0,
        "max_drawdown": 0.0,
        "turnover": 0.0,
        "bars": 5,
    }
    assert oos["policy_vs_flat"] == pytest.approx(0.05)
    assert oos["policy_vs_hold"] == pytest.approx(0.05 - 0.35)
    # fold 0: +0.3 beats flat and hold (0.1); fold 1: -0.25 beats neither (hold 0.25)
    assert (oos["folds_beating_flat"], oos["folds_beating_hold"]) == (1, 1)
    f0, f1 = report["folds"]
    assert f1["policy"]["max_drawdown"] == pytest.approx(0.3)  # from 0 at the fold's start to -0.3
    assert f0["policy"]["max_drawdown"] == 0.0
    # every Sharpe ratio is annualised at the out-of-sample estimate
    assert f0["policy"]["sharpe_annual"] == pytest.approx(f0["policy"]["sharpe_per_bar"] * 365.25**0.5)
    assert f1["test"] == {"start": "2024-02-02", "end": "2024-02-04", "bars": 3}
    assert report["meta"] == {"series": "synthetic", "seed": 0}


def test_folds_are_reported_in_time_order_whatever_their_order_in_the_list():
    folds = _two_folds()
    assert build_report(folds[::-1], {}) == build_report(folds, {})
    assert [f["index"] for f in build_report(folds[::-1], {})["folds"]] == [0, 1]


@pytest.mark.parametrize("second_start, message", [(31, "overlap"), (29, "overlap"), (30, "overlap")])
def test_test_windows_that_overlap_are_refused(second_start, message):
    folds = [_fold(0, 30, [0.1, 0.2], [0.0, 0.0]), _fold(1, second_start, [0.1, 0.2], [0.0, 0.0])]
    with pytest.raises(ValueError, match=message):
        build_report(folds, {})


def test_a_fold_list_must_be_non_empty_with_distinct_indices():
    with pytest.raises(ValueError, match="at least one fold"):
        build_report([], {})
    with pytest.raises(ValueError, match="two folds have index 0"):
        build_report([_fold(0, 30, [0.1], [0.0]), _fold(0, 40, [0.1], [0.0])], {})
    with pytest.raises(ValueError, match="meta must be a dict"):
        build_report(_two_folds(), [])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"policy_pnl": np.zeros(3)}, "policy_pnl must be 1-D of the 2 test bars"),
        ({"hold_pnl": np.array([0.0, np.nan])}, "hold_pnl must be finite: bar 1"),
        ({"hold_traded": np.array([1.0, -0.5])}, "hold_traded must be >= 0"),
        ({"time_ns": np.array([DAY, DAY])}, "time_ns must be strictly increasing"),
        ({"time_ns": np.array([0.0, 1.0])}, "integer nanoseconds"),
        ({"time_ns": np.zeros(0, dtype=np.int64)}, "the test window needs at least one bar"),
        ({"chosen": None}, "chosen must be a dict"),
        ({"test": {"start": "2024-01-01"}}, "test must be a Window"),
    ],
)
def test_a_fold_checks_its_arrays(change, message):
    fields = _fold(3, 30, [0.1, 0.2], [0.0, 0.0]).__dict__ | change
    with pytest.raises(ValueError, match=message) as err:
        FoldOutcome(**fields)
    assert str(err.value).startswith("fold 3:") and "\n" not in str(err.value)


def test_windows_name_dates_or_times():
    assert _window(0, 3) == Window("2024-01-01", "2024-01-03", 3)
    hours = DAY0 + np.array([9, 10, 11], dtype=np.int64) * (DAY // 24) + 30 * 60 * 10**9
    assert Window.of(hours) == Window("2024-01-01T09:30:00", "2024-01-01T11:30:00", 3)
    with pytest.raises(ValueError, match="bars must be an int >= 0"):
        Window("2024-01-01", "2024-01-02", -1)


def test_a_fold_survives_a_json_round_trip():
    fold = _two_folds()[1]
    back = FoldOutcome.from_dict(json.loads(json.dumps(fold.to_dict())))
    assert back.time_ns.dtype == np.int64 and back.test == fold.test and back.chosen == fold.chosen
    for name in ("time_ns", "policy_pnl", "policy_traded", "hold_pnl", "hold_traded"):
        np.testing.assert_array_equal(getattr(back, name), getattr(fold, name))


def _with_baselines(folds: list[FoldOutcome]) -> list[FoldOutcome]:
    """The folds with every baseline's P&L and trades (made up, one value a strategy and fold)."""
    for k, fold in enumerate(folds):
        n = len(fold.time_ns)
        fold.baselines = {name: (np.full(n, 0.01 * (k + 1 + i)), np.full(n, 0.1)) for i, name in enumerate(BASELINES)}
        fold.__post_init__()  # checked as a constructed fold is
    return folds


def test_the_baselines_are_scored_per_fold_and_out_of_sample(tmp_path):
    folds = _with_baselines(_two_folds())
    report = build_report(folds, {"series": "x"})
    assert strategies(report) == ("policy", "buy_and_hold", "flat", *BASELINES)
    oos = report["out_of_sample"]
    for i, name in enumerate(BASELINES):
        want = pnl_scores(np.array([0.01 * (1 + i)] * 2 + [0.01 * (2 + i)] * 3), np.full(5, 0.1), oos["bars_per_year"])
        assert {k: v for k, v in oos[name].items() if k != "empyrical"} == want
        assert report["folds"][0][name]["log_pnl"] == pytest.approx(0.02 * (1 + i))
    back = FoldOutcome.from_dict(json.loads(json.dumps(folds[1].to_dict())))
    for name in BASELINES:
        for a, b in zip(back.baselines[name], folds[1].baselines[name], strict=True):
            np.testing.assert_array_equal(a, b)
    text = report_markdown(report, "t")
    assert all(label in text for label in ("TS momentum", "MACD", "long only (vol-scaled)"))
    assert "against the best baseline's, MACD, " in comparison_sentence(report)
    # a fold recorded before the baselines: none out of sample, the rest as before
    old = folds[1].to_dict()
    del old["baselines"]
    mixed = build_report([folds[0], FoldOutcome.from_dict(old)], {})
    assert strategies(mixed) == ("policy", "buy_and_hold", "flat") and "MACD" not in report_markdown(mixed, "t")
    with pytest.raises(ValueError, match="baselines must be a dict of some of"):
        FoldOutcome.from_dict({**old, "baselines": {"kelly": {"pnl": [0.0] * 3, "traded": [0.0] * 3}}})
    with pytest.raises(ValueError, match="tsmom traded must be >= 0"):
        FoldOutcome.from_dict({**old, "baselines": {"tsmom": {"pnl": [0.0] * 3, "traded": [-1.0] * 3}}})


def test_report_json_reads_back_as_the_report(tmp_path):
    folds = _two_folds()
    folds[0].chosen = {"epoch": np.int64(3), "val_sharpe": np.float64(0.05), "flat": np.bool_(False)}
    report = build_report(folds, {"series": "synthetic", "cost_bps": 1.0})
    paths = write_report(tmp_path / "run", report, folds, "synthetic, seed 0")
    assert paths["json"] == tmp_path / "run" / "report.json"
    text = paths["json"].read_text()
    back = json.loads(text)
    assert back == json.loads(json.dumps(report, default=lambda v: v.item()))
    assert back["folds"][0]["chosen"] == {"epoch": 3, "val_sharpe": 0.05, "flat": False}
    assert back["out_of_sample"]["policy"]["bars"] == 5 and '\n  "meta"' in text  # indented
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in paths.values() if p is not None
    )


def test_a_nan_is_refused_before_any_file_is_written(tmp_path):
    folds = _two_folds()
    report = build_report(folds, {"learning_rate": float("nan")})
    with pytest.raises(ValueError, match="NaN or an infinity"):
        write_report(tmp_path / "run", report, folds, "t")
    assert not (tmp_path / "run").exists()


def test_the_report_must_be_of_these_folds(tmp_path):
    folds = _two_folds()
    with pytest.raises(ValueError, match="not these folds"):
        write_report(tmp_path, build_report(folds[:1], {}), folds, "t")


def _sentence_numbers(sentence: str) -> tuple[float, float]:
    m = re.fullmatch(
        r"The policy ended ([+-]\d+\.\d{4}) in log P&L against flat \(0\) and ([+-]\d+\.\d{4}) against "
        r"buy-and-hold over \S+ to \S+, beating flat in \d+ of \d+ folds and buy-and-hold in \d+\.",
        sentence,
    )
    assert m, sentence
    return float(m[1]), float(m[2])


@pytest.mark.parametrize(
    "policy, hold",
    [
        ([0.03, 0.001], [0.1, 0.043]),  # ahead of flat, behind buy-and-hold
        ([-0.02, -0.01], [-0.1, 0.01]),  # behind flat, ahead of buy-and-hold
        ([0.05, 0.01], [-0.2, 0.1]),  # ahead of both
    ],
)
def test_the_comparison_sentence_states_the_numbers(policy, hold):
    report = build_report([_fold(0, 30, policy, hold), _fold(1, 40, [0.0], [0.0])], {})
    vs_flat, vs_hold = _sentence_numbers(comparison_sentence(report))
    oos = report["out_of_sample"]
    assert vs_flat == pytest.approx(oos["policy_vs_flat"], abs=5e-5) and vs_flat == pytest.approx(sum(policy))
    assert vs_hold == pytest.approx(oos["policy_vs_hold"], abs=5e-5)
    assert np.sign(vs_flat) == np.sign(sum(policy)) and np.sign(vs_hold) == np.sign(sum(policy) - sum(hold))


def test_report_md_holds_every_fold_the_summary_and_the_sentence(tmp_path):
    folds = [_fold(i, 30 + 3 * i, [0.01, -0.02, 0.015], [0.02, 0.0, -0.01]) for i in range(3)]
    report = build_report(folds, {"series": "synthetic", "replay": "proportional"})
    md = write_report(tmp_path, report, folds, "synthetic: proportional")["markdown"].read_text()
    assert md.startswith("# synthetic: proportional\n") and "- replay: proportional" in md
    for f in report["folds"]:
        window = f"{f['test']['start']} to {f['test']['end']}"
        rows = [line for line in md.splitlines() if line.startswith(f"| {f['index']} | {window} |")]
        assert [row.split(" | ")[2] for row in rows] == ["policy", "buy-and-hold", "flat"]
        assert f"epoch {f['index'] + 1}, env_step {1000 * (f['index'] + 1)}, val_sharpe 0.05, flat False" in rows[0]
        assert f"| {f['policy']['log_pnl']:+.4f} |" in rows[0]
    assert "## Out of sample: 2024-01-31 to 2024-02-08, 9 bars, 3 folds" in md
    assert f"| policy | {report['out_of_sample']['policy']['log_pnl']:+.4f} |" in md
    assert comparison_sentence(report) in md.splitlines()


def test_one_bar_cannot_be_annualised():
    report = build_report([_fold(0, 30, [0.01], [0.02])], {})
    assert report["out_of_sample"]["bars_per_year"] is None
    assert report["out_of_sample"]["policy"]["sharpe_annual"] is None
    assert "not annualised" in report_markdown(report, "t") and "| n/a |" in report_markdown(report, "t")


def test_equity_png_is_a_png_of_the_three_curves(tmp_path):
    pytest.importorskip("matplotlib")
    from gper.walkforward.plot import equity_figure

    folds = _two_folds()
    paths = write_report(tmp_path, build_report(folds, {}), folds, "synthetic")
    assert paths["png"] == tmp_path / "equity.png"
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC
    assert "![cumulative out-of-sample log P&L](equity.png)" in paths["markdown"].read_text()
    (ax,) = equity_figure(folds[::-1], "synthetic").axes
    assert ax.get_title() == "synthetic"
    curves = {line.get_label(): line for line in ax.lines[:3]}
    np.testing.assert_allclose(curves["policy"].get_ydata(), [0.1, 0.3, 0.2, 0.0, 0.05], atol=1e-15)
    np.testing.assert_allclose(curves["buy-and-hold"].get_ydata(), [0.05, 0.1, 0.2, 0.15, 0.35], atol=1e-15)
    np.testing.assert_array_equal(curves["flat"].get_ydata(), np.zeros(5))
    assert len(ax.lines) == 3 + 2  # a line at each fold's test start, marked with its index
    assert [t.get_text().strip() for t in ax.texts] == ["0", "1"]


def test_without_matplotlib_the_report_is_written_without_the_png(tmp_path, monkeypatch):
    (tmp_path / "equity.png").write_bytes(b"an earlier run's plot")
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib` raises ImportError
    folds = _two_folds()
    paths = write_report(tmp_path, build_report(folds, {}), folds, "t")
    assert paths["png"] is None and not (tmp_path / "equity.png").exists()
    md = paths["markdown"].read_text()
    assert 'No equity.png: the plot needs matplotlib: pip install ".[train]"' in md and "![" not in md
    assert json.loads(paths["json"].read_text())["out_of_sample"]["bars"] == 5


def _run(series: str, replay: str, seed: int, policy_scale: float, hold: list[float]) -> dict:
    folds = [_fold(0, 30, [0.01 * policy_scale, 0.02], hold[:2]), _fold(1, 32, [-0.01, 0.005], hold[2:])]
    return {"series": series, "replay": replay, "seed": seed, "report": build_report(folds, {})}


def test_aggregate_groups_runs_by_series_and_replay():
    hold_a, hold_b = [0.01, 0.02, -0.01, 0.03], [-0.02, 0.0, 0.01, -0.03]
    rows = [
        _run("a", "proportional", 0, 1.0, hold_a),
        _run("a", "uniform", 0, -2.0, hold_a),
        _run("a", "proportional", 1, 3.0, hold_a),
        _run("b", "proportional", 0, 1.0, hold_b),
    ]
    out = aggregate(rows)
    assert [(s["series"], s["replay"], s["runs"], s["seeds"]) for s in out] == [
        ("a", "proportional", 2, [0, 1]),
        ("a", "uniform", 1, [0]),
        ("b", "proportional", 1, [0]),
    ]
    a_prop = out[0]
    # policy log P&L 0.01 s + 0.02 - 0.01 + 0.005 = 0.015 + 0.01 s for s = 1 and 3
    assert (a_prop["policy_log_pnl_min"], a_prop["policy_log_pnl_max"]) == pytest.approx((0.025, 0.045))
    assert a_prop["policy_log_pnl_mean"] == pytest.approx(0.035)
    sharpes = [r["report"]["out_of_sample"]["policy"]["sharpe_annual"] for r in (rows[0], rows[2])]
    assert a_prop["policy_sharpe_annual_mean"] == pytest.approx(sum(sharpes) / 2)
    assert a_prop["buy_and_hold_log_pnl"] == pytest.approx(0.05) and out[2]["buy_and_hold_log_pnl"] == pytest.approx(
        -0.04
    )
    assert a_prop["flat_log_pnl"] == 0.0
    assert (a_prop["runs_beating_flat"], a_prop["runs_beating_hold"]) == (2, 0)
    md = aggregate_markdown(out)
    assert len(md.splitlines()) == 2 + 3
    assert "| a | proportional | 2 | 2024-01-31 to 2024-02-03 (4 bars) | +0.0350 [+0.0250, +0.0450] |" in md


def test_aggregate_refuses_runs_that_do_not_match():
    hold = [0.01, 0.02, -0.01, 0.03]
    with pytest.raises(ValueError, match="two runs of series 'a', replay 'p', seed 0"):
        aggregate([_run("a", "p", 0, 1.0, hold), _run("a", "p", 0, 2.0, hold)])
    with pytest.raises(ValueError, match="differ in buy-and-hold"):
        aggregate([_run("a", "p", 0, 1.0, hold), _run("a", "u", 0, 1.0, [0.0] * 4)])
    with pytest.raises(ValueError, match="lacks seed"):
        aggregate([{"series": "a", "replay": "p", "report": {}}])
    with pytest.raises(ValueError, match="at least one run"):
        aggregate([])


#: what the report's modules may import: numpy and the standard library at the top, matplotlib
#: only inside a function; a runner that trains (gper.dqn) lives beside them, not in them
PURE = ("__init__", "scores", "outcome", "report", "plot", "aggregate", "baselines")
ALLOWED = {"__future__", "dataclasses", "itertools", "json", "math", "pathlib", "typing", "numpy", "gper._files"}
ALLOWED |= {"gper._volatility"}  # numpy only: the baselines' volatility, shared with the market environment


def test_the_report_modules_import_numpy_and_matplotlib_only():
    root = Path(__file__).resolve().parents[2] / "src" / "gper" / "walkforward"
    for name in PURE:
        tree = ast.parse((root / f"{name}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                for module in names:
                    assert module in ALLOWED or module.startswith("gper.walkforward."), f"{name}.py imports {module}"
        lazy = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and n not in tree.body]
        for node in lazy:
            module = node.names[0].name if isinstance(node, ast.Import) else node.module
            assert module.startswith("matplotlib"), f"{name}.py imports {module} inside a function"

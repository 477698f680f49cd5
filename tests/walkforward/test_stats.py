"""empyrical-reloaded's statistics in the walk-forward report: what they are (hand formulas on a
small series), flat's undefined ratios as None, and the report without the library."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_walkforward_report import _two_folds

from gper.walkforward import stats
from gper.walkforward.report import build_report, report_json, report_markdown

needs_empyrical = pytest.mark.skipif(
    stats.empyrical() is None, reason="empyrical-reloaded comes with the data extra on Python 3.11+"
)


@needs_empyrical
def test_the_statistics_are_empyricals_on_simple_returns():
    log_pnl = np.log1p(np.array([0.01, -0.02, 0.015, 0.005, -0.01, 0.02]))
    r = np.expm1(log_pnl)
    per_year = 252.0
    got = stats.performance(log_pnl, per_year)
    years = len(r) / per_year
    assert got["annual_return"] == pytest.approx(np.prod(1 + r) ** (1 / years) - 1)
    assert got["annual_volatility"] == pytest.approx(r.std(ddof=1) * math.sqrt(per_year))
    assert got["sharpe_ratio"] == pytest.approx(r.mean() / r.std(ddof=1) * math.sqrt(per_year))
    downside = math.sqrt(np.mean(np.minimum(r, 0.0) ** 2)) * math.sqrt(per_year)
    assert got["sortino_ratio"] == pytest.approx(r.mean() * per_year / downside)
    equity = np.cumprod(1 + r)
    drawdown = (equity / np.maximum.accumulate(np.concatenate(([1.0], equity)))[1:] - 1).min()
    assert got["max_drawdown"] == pytest.approx(drawdown)
    assert got["calmar_ratio"] == pytest.approx(got["annual_return"] / abs(drawdown))


@needs_empyrical
def test_flat_has_no_ratios_and_the_report_stays_json():
    got = stats.performance(np.zeros(10), 252.0)
    assert got["sharpe_ratio"] is None and got["sortino_ratio"] is None and got["annual_return"] == 0.0
    assert stats.performance(np.zeros(10), None) is None  # no year to annualise with
    report = build_report(_two_folds(), {"series": "x"})
    oos = json.loads(report_json(report))["out_of_sample"]
    assert set(oos["policy"]["empyrical"]) == set(stats.STATISTICS)
    assert oos["flat"]["empyrical"]["sharpe_ratio"] is None
    md = report_markdown(report, "t")
    assert "empyrical's statistics" in md and "Sortino" in md and "Left out" not in md
    with pytest.raises(ValueError, match="finite 1-D"):
        stats.performance(np.array([np.nan]), 252.0)


def test_without_empyrical_the_report_says_how_to_get_the_statistics(monkeypatch):
    monkeypatch.setattr(stats, "empyrical", lambda: None)
    report = build_report(_two_folds(), {"series": "x"})
    assert report["out_of_sample"]["policy"]["empyrical"] is None
    assert 'Left out: they need empyrical-reloaded: pip install ".[data]"' in report_markdown(report, "t")

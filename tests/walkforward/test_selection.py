"""The deflated Sharpe ratio (:mod:`gper.walkforward.selection`) against the formulas with scipy's
normal distribution and moments, and what it says of skill and of luck."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gper.walkforward.selection import deflated_sharpe, expected_max_sharpe, probabilistic_sharpe

stats = pytest.importorskip("scipy.stats")


def _oracle(candidates, chosen):
    srs = [c.mean() / c.std() for c in candidates]
    n, g = len(srs), 0.5772156649015329
    sr0 = (
        0.0
        if n == 1
        else np.std(srs, ddof=1) * ((1 - g) * stats.norm.ppf(1 - 1 / n) + g * stats.norm.ppf(1 - 1 / (n * math.e)))
    )
    x = candidates[chosen]
    sr, g3, g4 = srs[chosen], stats.skew(x), stats.kurtosis(x, fisher=True) + 3
    z = (sr - sr0) * math.sqrt(len(x) - 1) / math.sqrt(1 - g3 * sr + (g4 - 1) / 4 * sr**2)
    return stats.norm.cdf(z), sr0


@pytest.mark.parametrize("n", [1, 2, 11, 40])
def test_the_formula(n):
    rng = np.random.default_rng(n)
    candidates = [rng.standard_t(5, 250) * 0.01 + 0.0005 * k for k in range(n)]
    chosen = int(np.argmax([c.mean() / c.std() for c in candidates]))
    got = deflated_sharpe(candidates, chosen)
    want, sr0 = _oracle(candidates, chosen)
    assert got["trials"] == n and got["expected_max_sharpe"] == pytest.approx(sr0, rel=1e-12, abs=1e-15)
    assert got["deflated_sharpe"] == pytest.approx(want, rel=1e-9)
    assert got["sharpe_per_bar"] == pytest.approx(candidates[chosen].mean() / candidates[chosen].std())


def test_luck_is_deflated_and_skill_is_not():
    """The best of 40 skill-free candidates looks good alone (its PSR against 0) and not once the 40
    are counted; a candidate with a true edge keeps a high deflated ratio among them."""
    rng = np.random.default_rng(0)
    noise = [rng.normal(0.0, 0.01, 250) for _ in range(40)]
    best = int(np.argmax([c.mean() / c.std() for c in noise]))
    assert probabilistic_sharpe(noise[best], 0.0) > 0.95
    assert deflated_sharpe(noise, best)["deflated_sharpe"] < 0.75  # about even: the best of 40 sits near SR0
    edge = rng.normal(0.003, 0.01, 250)  # a per-bar Sharpe ratio near 0.3 (about 4.8 a year)
    assert deflated_sharpe([*noise, edge], 40)["deflated_sharpe"] > 0.95


def test_edge_cases_and_bad_input():
    assert expected_max_sharpe(np.array([0.1])) == 0.0
    flat = np.zeros(20)
    assert deflated_sharpe([flat], 0)["deflated_sharpe"] == 0.5  # SR 0 against 0
    with pytest.raises(ValueError, match="chosen must index"):
        deflated_sharpe([flat], 1)
    with pytest.raises(ValueError, match="at least 2 bars"):
        probabilistic_sharpe(np.zeros(1), 0.0)

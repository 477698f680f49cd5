"""The daily bars that the arch package ships (--data arch:sp500, arch:nasdaq), read from its files."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
import torch

from gper.envs.market import MarketEnv
from gper.envs.packaged import PACKAGED, is_packaged, packaged_bars, read_bars

pytestmark = pytest.mark.skipif(importlib.util.find_spec("arch") is None, reason='needs pip install ".[data]"')


@pytest.mark.parametrize("name", sorted(PACKAGED))
def test_packaged_daily_bars(name):
    bars = packaged_bars(name)
    t = bars.time_ns.numpy().astype("datetime64[ns]").astype("datetime64[D]")
    assert len(bars.close) == 5031 and bars.close.dtype == torch.float64
    assert str(t[0]) == "1999-01-04" and str(t[-1]) == "2018-12-31"
    assert bool((np.diff(bars.time_ns.numpy()) > 0).all()) and bool((bars.close > 0).all())
    # weekdays only, about 252 a year: daily bars of an exchange
    assert set(t.astype("datetime64[D]").view(np.int64) % 7) <= {0, 1, 4, 5, 6}  # epoch day 0 was a Thursday
    assert 245 < len(t) / 20 < 255


def test_known_closes_and_no_import_of_arch():
    sys.modules.pop("arch", None)
    sp = packaged_bars("sp500")
    assert float(sp.close[0]) == pytest.approx(1228.099976) and float(sp.close[-1]) == pytest.approx(2506.850098)
    assert "arch" not in sys.modules  # the files are read, the package (and its SciPy, pandas) not imported


def test_read_bars_and_the_market_env_take_packaged_names(tmp_path):
    assert is_packaged("arch:sp500") and not is_packaged("prices.csv") and not is_packaged(None)
    assert torch.equal(read_bars("arch:nasdaq").close, packaged_bars("nasdaq").close)
    env = MarketEnv.from_source(2, "cpu", data="arch:sp500", split="test")
    assert env.n_bars == 41 + 1006  # WARMUP + 1 bars of history, then the last fifth
    with pytest.raises(ValueError, match="unknown packaged bars arch:dow"):
        read_bars("arch:dow")
    with pytest.raises(ValueError, match="at least 6000"):
        read_bars("arch:sp500", min_rows=6000)

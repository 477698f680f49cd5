"""Close-price series for :mod:`gper.envs.market`: seeded synthetic markets and CSV bar files.

Both return float64 close prices ``[n_bars]`` on the CPU; the environment moves them to its device.

The synthetic markets exist so a DQN has something learnable but not trivial to trade, with
held-out data of the same law for evaluation. Their predictable part is about a tenth of a
bar's volatility: enough for momentum or reversion features to pay after a 1 bp cost, far too little
to read off a single bar.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import torch

CSV_COLUMNS = ("timestamp", "open", "high", "low", "close", "volume")
"""Columns a bar file must have (any case, any order, extra columns allowed)."""
PRICE_COLUMNS = ("open", "high", "low", "close")
"""Columns checked to be finite positive numbers; only ``close`` is used."""
SYNTHETIC_KINDS = ("regime", "ou")


def synthetic_prices(
    n_bars: int,
    seed: int,
    kind: str = "regime",
    *,
    vol: float = 0.01,
    drift: float = 0.15,
    regime_duration: float = 150.0,
    vol_duration: float = 300.0,
    kappa: float = 0.03,
    trend_vol: float = 0.001,
    start_price: float = 100.0,
) -> torch.Tensor:
    """A seeded synthetic close-price series, float64 ``[n_bars]`` on the CPU.

    ``kind="regime"`` (momentum is the signal): log returns ``r_t = s_t * (d_t * drift + eps_t)``
    with ``eps_t ~ N(0, 1)``. The drift regime ``d_t`` in {-1, 0, +1} (down, flat, up) is a Markov
    chain that leaves its state with probability ``1 / regime_duration`` per bar (mean duration
    ``regime_duration`` bars) for one of the other two at random; so in a trend the mean return is
    ``drift`` (0.15) times the bar's volatility. The volatility ``s_t`` switches between
    ``0.75 * vol`` and ``1.25 * vol`` (about ``vol`` = 1% per bar overall) with mean duration
    ``vol_duration`` bars.

    ``kind="ou"`` (reversion is the signal): log price ``m_t + x_t``, a slow random walk ``m``
    (steps ``N(0, trend_vol^2)``) plus a deviation ``x_t = (1 - kappa) x_{t-1} + vol * eps_t`` that
    reverts with half-life ``ln 2 / kappa`` (23 bars at 0.03). The predictable part of a return,
    ``-kappa * x_{t-1}``, has a standard deviation of about 0.12 of the return's.

    Args:
        n_bars: length of the series, >= 2.
        seed: seeds a CPU ``torch.Generator``; the same seed gives the same series on any machine.
        kind: "regime" or "ou".
    """
    if not isinstance(n_bars, int) or n_bars < 2:
        raise ValueError(f"n_bars must be an int >= 2, got {n_bars!r}")
    if kind not in SYNTHETIC_KINDS:
        raise ValueError(f"unknown synthetic kind {kind!r}: expected one of {', '.join(SYNTHETIC_KINDS)}")
    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    n = n_bars - 1

    def normal() -> torch.Tensor:
        return torch.randn(n, dtype=torch.float64, generator=g)

    def uniform() -> torch.Tensor:
        return torch.rand(n, dtype=torch.float64, generator=g)

    if kind == "regime":
        # A switch moves the regime index 1 or 2 steps around {0, 1, 2}: always to one of the others.
        switch = uniform() < 1.0 / regime_duration
        hop = torch.where(uniform() < 0.5, 1, 2)
        first = int(torch.randint(3, (), generator=g))
        regime = (first + torch.cumsum(switch * hop, 0)) % 3
        vol_switch = uniform() < 1.0 / vol_duration
        high_vol = (int(torch.randint(2, (), generator=g)) + torch.cumsum(vol_switch.long(), 0)) % 2
        s = vol * torch.where(high_vol == 1, 1.25, 0.75).double()
        returns = s * ((regime - 1).double() * drift + normal())
    else:
        eps, walk = normal(), normal() * trend_vol
        x = float(torch.randn((), dtype=torch.float64, generator=g)) * vol / math.sqrt(1 - (1 - kappa) ** 2)
        deviation = []
        for e in (eps * vol).tolist():
            x_next = (1 - kappa) * x + e
            deviation.append(x_next - x)
            x = x_next
        returns = walk + torch.tensor(deviation, dtype=torch.float64)
    log_prices = torch.cat((torch.zeros(1, dtype=torch.float64), torch.cumsum(returns, 0)))
    return start_price * torch.exp(log_prices)


def load_bars_csv(path: str | Path, min_rows: int = 2) -> torch.Tensor:
    """Close prices of a bar file, float64 ``[rows]`` on the CPU, in file order (oldest first).

    The file needs a header naming :data:`CSV_COLUMNS` (any case; extra columns are ignored) and
    at least ``min_rows`` rows. Open, high, low and close must be finite positive numbers.

    Raises:
        ValueError: naming the file and, for a bad value, its line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"price file {str(path)!r} does not exist")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected a header with columns {', '.join(CSV_COLUMNS)}")
        names = [h.strip().lower() for h in header]
        missing = [c for c in CSV_COLUMNS if c not in names]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
        cols = [names.index(c) for c in PRICE_COLUMNS]
        closes = []
        for line, row in enumerate(reader, start=2):
            if not any(cell.strip() for cell in row):
                continue
            values = []
            for name, col in zip(PRICE_COLUMNS, cols, strict=True):
                cell = row[col].strip() if col < len(row) else ""
                try:
                    value = float(cell)
                except ValueError:
                    raise ValueError(f"{path}, line {line}: {name} {cell!r} is not a number") from None
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"{path}, line {line}: {name} {cell!r} is not a finite positive price")
                values.append(value)
            closes.append(values[-1])
    if len(closes) < min_rows:
        raise ValueError(f"{path}: {len(closes)} bars, at least {min_rows} needed")
    return torch.from_numpy(np.asarray(closes, dtype=np.float64))

"""Close-price series for :mod:`gper.envs.market`: seeded synthetic markets and CSV bar files.

Both give float64 close prices ``[n_bars]`` on the CPU; the environment moves them to its device.
A bar file's timestamps come with its prices from :func:`read_bars_csv`.

The synthetic markets exist so a DQN has something learnable but not trivial to trade, with
held-out data of the same law for evaluation. Their predictable part is about a tenth of a
bar's volatility: enough for momentum or reversion features to pay after a 1 bp cost, far too little
to read off a single bar.
"""

from __future__ import annotations

import csv
import math
from array import array
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gper.envs.timestamps import timestamp_parser

TIME_COLUMNS = ("timestamp", "datetime", "date", "time")
"""Names a bar file's time column may have (any case); a file has exactly one of them."""
BAR_COLUMNS = ("open", "high", "low", "close", "volume")
"""Columns a bar file must have besides its time column (any case, any order, extra columns allowed).

All are checked; only ``close`` is returned."""
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


def business_days(n: int, first: str = "2000-01-03") -> torch.Tensor:
    """int64 ``[n]`` nanoseconds of ``n`` consecutive weekdays from ``first`` (midnight UTC): the
    calendar that synthetic daily bars are given for walk-forward folds by months or days."""
    days = np.busday_offset(np.datetime64(first, "D"), np.arange(n), roll="forward")
    return torch.from_numpy(days.astype("datetime64[ns]").astype(np.int64))


def synthetic_bars(n_bars: int, seed: int, kind: str = "regime") -> Bars:
    """:func:`synthetic_prices` as daily bars on weekdays from 2000-01-03 (:func:`business_days`)."""
    return Bars(business_days(n_bars), synthetic_prices(n_bars, seed, kind))


_ORDER = "bars must be oldest first, each after the one before"


class Bars(NamedTuple):
    """The bars of a bar file, oldest first: ``time_ns[i]`` is the time of ``close[i]``."""

    time_ns: torch.Tensor
    """[rows] int64: nanoseconds since the Unix epoch (:mod:`gper.envs.timestamps`), strictly increasing."""
    close: torch.Tensor
    """[rows] float64: close prices."""


def _number(row: list[str], col: int, name: str) -> tuple[float, str]:
    cell = row[col].strip() if col < len(row) else ""
    try:
        return float(cell), cell
    except ValueError:
        raise ValueError(f"{name} {cell!r} is not a number") from None


def _bar_problem(row: list[str], cols: list[int]) -> str:
    """What is wrong with a bar that failed :func:`_bar_close`'s test, for its error message."""
    (o, o_cell), (h, h_cell), (lo, l_cell), (c, c_cell), (v, v_cell) = (
        _number(row, col, name) for name, col in zip(BAR_COLUMNS, cols, strict=True)
    )
    for name, value, cell in (("open", o, o_cell), ("high", h, h_cell), ("low", lo, l_cell), ("close", c, c_cell)):
        if not (math.isfinite(value) and value > 0):
            return f"{name} {cell!r} is not a finite positive price"
    if not (math.isfinite(v) and v >= 0):
        return f"volume {v_cell!r} is not a finite number >= 0"
    if h < lo:
        return f"high {h_cell!r} is below low {l_cell!r}"
    for name, value, cell in (("open", o, o_cell), ("close", c, c_cell)):
        if h < value:
            return f"high {h_cell!r} is below {name} {cell!r}"
        if lo > value:
            return f"low {l_cell!r} is above {name} {cell!r}"
    raise AssertionError(f"no problem found with bar {row!r}")


def _bar_close(row: list[str], cols: list[int]) -> float:
    """The close of a row whose OHLC prices are finite, positive and consistent and whose volume is >= 0.

    Raises:
        ValueError: saying what is wrong with any other row.
    """
    o_col, h_col, l_col, c_col, v_col = cols
    try:
        o, h, lo, c, v = float(row[o_col]), float(row[h_col]), float(row[l_col]), float(row[c_col]), float(row[v_col])
    except (IndexError, ValueError):
        o = h = lo = c = v = math.nan
    # one chained comparison per bar; NaN fails it, and so does any infinity
    if 0 < lo <= o <= h < math.inf and lo <= c <= h and 0 <= v < math.inf:
        return c
    raise ValueError(_bar_problem(row, cols))


def _time_column(path: Path, header: list[str], names: list[str]) -> int:
    found = [n for n in names if n in TIME_COLUMNS]
    if not found:
        raise ValueError(f"{path}: no time column: name one of {', '.join(TIME_COLUMNS)} (header: {', '.join(header)})")
    if len(found) > 1:
        raise ValueError(
            f"{path}: {len(found)} time columns ({', '.join(found)}): keep one, or join date and time "
            "into one timestamp column (2020-01-31T09:30:00)"
        )
    return names.index(found[0])


def read_bars_csv(path: str | Path, min_rows: int = 2) -> Bars:
    """The timestamps and close prices of a bar file, on the CPU, in file order.

    The file is CSV with a header naming one time column (:data:`TIME_COLUMNS`: ``timestamp``,
    ``datetime``, ``date`` or ``time``) and :data:`BAR_COLUMNS` (open, high, low, close, volume), in
    any case and order; extra columns are ignored, blank lines skipped. A file without a time
    column is refused: its order, and so which bars are the past, could not be checked. Timestamps
    are ISO 8601 dates or times, or Unix epoch seconds (:mod:`gper.envs.timestamps`), oldest first,
    each strictly after the one before. Every bar needs finite positive prices with
    ``low <= min(open, close)`` and ``high >= max(open, close)``, and a finite volume >= 0. There
    must be at least ``min_rows`` bars.

    The file is read once, a row at a time, into 16 bytes a bar.

    Raises:
        ValueError: naming the file and, for a bad bar, its line (1-based, the header is line 1).
            Nothing is returned for a file with any bad bar.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"price file {str(path)!r} does not exist")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected a header with a time column and {', '.join(BAR_COLUMNS)}")
        names = [h.strip().lower() for h in header]
        time_col = _time_column(path, header, names)
        missing = [c for c in BAR_COLUMNS if c not in names]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
        cols = [names.index(c) for c in BAR_COLUMNS]
        times, closes = array("q"), array("d")
        parse = None
        prev_line, prev_cell = 0, ""
        # A second bar older than the first may start a newest-first file: that is said at the end
        # if every bar is older than the one before; otherwise the error is still the second bar's.
        newest_first = None
        for row in reader:
            if not "".join(row).strip():
                continue
            line = reader.line_num
            try:
                cell = row[time_col].strip() if time_col < len(row) else ""
                if parse is None:
                    parse = timestamp_parser(cell)
                t = parse(cell)
                closes.append(_bar_close(row, cols))
                if newest_first is not None and t >= times[-1]:
                    raise ValueError(newest_first[1])  # reported below as the second bar's error
                if newest_first is None and times and t <= times[-1]:
                    same = "is the same time as" if t == times[-1] else "is before"
                    problem = f"timestamp {cell!r} {same} line {prev_line}'s {prev_cell!r}"
                    if len(times) > 1 or t == times[-1]:
                        raise ValueError(f"{problem}: {_ORDER}")
                    newest_first = (line, problem)
            except ValueError as e:
                if newest_first is not None:
                    raise ValueError(f"{path}, line {newest_first[0]}: {newest_first[1]}: {_ORDER}") from None
                raise ValueError(f"{path}, line {line}: {e}") from None
            times.append(t)
            prev_line, prev_cell = line, cell
    if newest_first is not None:
        raise ValueError(
            f"{path}, line {newest_first[0]}: {newest_first[1]}, and every later bar is older than the one "
            "before: newest-first file? Bars must be oldest first: reverse the rows below the header"
        )
    if len(closes) < min_rows:
        raise ValueError(f"{path}: {len(closes)} bars, at least {min_rows} needed")
    return Bars(torch.from_numpy(np.frombuffer(times, dtype=np.int64)), torch.from_numpy(np.frombuffer(closes)))


def load_bars_csv(path: str | Path, min_rows: int = 2) -> torch.Tensor:
    """Close prices of a bar file, float64 ``[rows]`` on the CPU, oldest first: ``read_bars_csv(path, min_rows).close``.

    See :func:`read_bars_csv` for the file's format and checks.

    Raises:
        ValueError: naming the file and, for a bad bar, its line.
    """
    return read_bars_csv(path, min_rows).close

"""Real daily bars that ship inside a well-kept package, read from its files: never downloaded.

``--data arch:sp500`` and ``--data arch:nasdaq`` are the daily bars of the S&P 500 and NASDAQ
Composite indices, 1999-01-04 to 2018-12-31 (5,031 bars each), that the ``arch`` package
(Kevin Sheppard's ARCH models) ships as ``arch.data.sp500`` and ``arch.data.nasdaq``:
``pip install ".[data]"``. The files are found where the package is installed and read with
gper's own checks (:func:`gper.envs.market_data.read_bars_csv`'s rules for prices and order);
``arch`` itself is not imported, so its own dependencies (SciPy, pandas, statsmodels) are not
loaded either.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
from array import array
from pathlib import Path

import numpy as np
import torch

from gper.envs.market_data import Bars, _bar_close, read_bars_csv
from gper.envs.timestamps import NS_PER_DAY, _days

PREFIX = "arch:"
#: name -> (file inside the arch package, what it holds)
PACKAGED: dict[str, tuple[str, str]] = {
    "sp500": ("data/sp500/sp500.csv.gz", "S&P 500 index, daily bars, 1999-2018"),
    "nasdaq": ("data/nasdaq/nasdaq.csv.gz", "NASDAQ Composite index, daily bars, 1999-2018"),
}
_COLUMNS = ("Open", "High", "Low", "Close", "Volume")


def is_packaged(source: str | Path | None) -> bool:
    """Whether ``source`` names packaged bars (``arch:<name>``) rather than a CSV file."""
    return isinstance(source, str) and source.startswith(PREFIX)


def packaged_path(name: str) -> Path:
    """Where the installed ``arch`` package keeps the bars ``name`` (a key of :data:`PACKAGED`).

    Raises:
        ValueError: an unknown name.
        ImportError: ``arch`` is not installed (the message says how to install it).
    """
    if name not in PACKAGED:
        raise ValueError(
            f"unknown packaged bars {PREFIX}{name}: expected one of {', '.join(PREFIX + n for n in PACKAGED)}"
        )
    spec = importlib.util.find_spec("arch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f'--data {PREFIX}{name} reads the bars that the arch package ships: pip install ".[data]"')
    path = Path(next(iter(spec.submodule_search_locations))) / PACKAGED[name][0]
    if not path.is_file():
        raise ImportError(f'the installed arch package has no {PACKAGED[name][0]}: pip install ".[data]" (arch >= 5)')
    return path


def _date_ns(cell: str) -> int:
    """Nanoseconds since the epoch of a ``M/D/YYYY`` date (midnight UTC), as arch's files write them."""
    parts = cell.split("/")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"date {cell!r} is not M/D/YYYY")
    month, day, year = parts
    try:
        return _days(year.zfill(4), month.zfill(2), day.zfill(2)) * NS_PER_DAY
    except ValueError:
        raise ValueError(f"date {cell!r} is not a calendar date") from None


def packaged_bars(name: str) -> Bars:
    """The timestamps and closes of the packaged bars ``name`` (``sp500`` or ``nasdaq``), oldest first.

    Every bar passes the checks of a CSV bar file (finite positive prices, high and low around open
    and close, volume >= 0, strictly increasing dates).

    Raises:
        ValueError: an unknown name, or a file that fails a check (naming its line).
        ImportError: ``arch`` is not installed.
    """
    path = packaged_path(name)
    times, closes = array("q"), array("d")
    with gzip.open(path, "rt", newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        cols = [header.index(c) for c in _COLUMNS]
        date_col = header.index("Date")
        for row in reader:
            if not "".join(row).strip():
                continue
            try:
                t = _date_ns(row[date_col].strip())
                if times and t <= times[-1]:
                    raise ValueError(f"date {row[date_col]!r} is not after the bar before")
                closes.append(_bar_close(row, cols))
            except ValueError as e:
                raise ValueError(f"{path}, line {reader.line_num}: {e}") from None
            times.append(t)
    return Bars(torch.from_numpy(np.frombuffer(times, dtype=np.int64)), torch.from_numpy(np.frombuffer(closes)))


def read_bars(source: str | Path, min_rows: int = 2) -> Bars:
    """The bars of ``source``: packaged ones (``arch:sp500``, ``arch:nasdaq``) or a CSV bar file.

    Raises:
        ValueError: a bad file or name, or fewer than ``min_rows`` bars.
        ImportError: packaged bars without ``arch`` installed.
    """
    if not is_packaged(source):
        return read_bars_csv(source, min_rows)
    bars = packaged_bars(str(source)[len(PREFIX) :])
    if len(bars.close) < min_rows:
        raise ValueError(f"{source}: {len(bars.close)} bars, at least {min_rows} needed")
    return bars


__all__ = ["PACKAGED", "is_packaged", "packaged_bars", "packaged_path", "read_bars"]

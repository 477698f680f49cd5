"""Bar files: the time column, the checks of order and of each bar, what a valid file loads as, and
that a refused file names its first bad line (the timestamps' own formats: ``test_timestamps.py``)."""

from __future__ import annotations

import csv
import re
from datetime import datetime, timedelta, timezone

import pytest
import torch

from gper.envs.market import MarketEnv
from gper.envs.market_data import load_bars_csv, read_bars_csv

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
HEADER = "timestamp,open,high,low,close,volume"


def ns(*args: int, tz: timezone = timezone.utc) -> int:
    """Nanoseconds since the epoch of ``datetime(*args)``, to the microsecond."""
    return (datetime(*args, tzinfo=tz) - EPOCH) // timedelta(microseconds=1) * 1000


def bar_rows(n: int, start: datetime = datetime(2024, 1, 1, 9, 30)) -> list[list[str]]:
    """``n`` consistent bars a minute apart: open, high, low, close around a price that rises 1 a bar."""
    rows = []
    for i in range(n):
        price = 100.0 + i
        cells = (price, price + 1.5, price - 1.0, price + 0.5, 10 * i)
        rows.append([(start + timedelta(minutes=i)).isoformat(), *map(str, cells)])
    return rows


def write(path, rows, header=HEADER):
    lines = [header] + [",".join(row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def closes_by_csv(path) -> list[float]:
    """The close column, read with nothing but the csv module: what any valid file must load as."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [float(row["close"]) for row in rows]


def test_valid_file_loads_its_closes_and_times(tmp_path):
    path = write(tmp_path / "bars.csv", bar_rows(50))
    bars = read_bars_csv(path)
    assert bars.close.dtype == torch.float64 and bars.time_ns.dtype == torch.int64
    assert bars.close.tolist() == closes_by_csv(path)
    assert torch.equal(load_bars_csv(path), bars.close)
    assert bars.time_ns.tolist() == [ns(2024, 1, 1, 9, 30) + i * 60 * 10**9 for i in range(50)]


@pytest.mark.parametrize("name", ["Date", "TIME", "datetime", " Timestamp "])
def test_time_column_names(tmp_path, name):
    path = write(tmp_path / "bars.csv", bar_rows(5), header=f"{name},Open,High,Low,Close,Volume")
    assert read_bars_csv(path).time_ns[0] == ns(2024, 1, 1, 9, 30)


def test_columns_in_any_order_with_extras(tmp_path):
    rows = [[r[5], "x", r[4], r[1], r[0], r[2], r[3]] for r in bar_rows(5)]
    path = write(tmp_path / "bars.csv", rows, header="volume,extra,close,open,date,high,low")
    bars = read_bars_csv(path)
    assert bars.close.tolist() == [100.5, 101.5, 102.5, 103.5, 104.5]
    assert bars.time_ns[1] - bars.time_ns[0] == 60 * 10**9


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("open,high,low,close,volume", "no time column: name one of timestamp, datetime, date, time"),
        ("date,time,open,high,low,close,volume", r"2 time columns \(date, time\): keep one"),
    ],
)
def test_time_column_missing_or_ambiguous(tmp_path, header, message):
    rows = [["2020-01-01", *r] if header.startswith("date") else r[1:] for r in bar_rows(5)]
    path = write(tmp_path / "bars.csv", rows, header=header)
    with pytest.raises(ValueError, match=message):
        read_bars_csv(path)


def edited(rows, line, column, value):
    """``rows`` with file line ``line``'s cell in ``column`` (0: time, then open, high, low, close, volume) set."""
    rows = [list(r) for r in rows]
    rows[line - 2][column] = value
    return rows


T, OPEN, HIGH, LOW, CLOSE, VOLUME = range(6)


@pytest.mark.parametrize(
    ("line", "column", "value", "message"),
    [
        (2, T, "yesterday", "line 2: timestamp 'yesterday' is neither"),
        (5, T, "31/01/2024", "line 5: timestamp '31/01/2024' is not an ISO 8601"),
        (5, T, "", "line 5: timestamp '' is not an ISO 8601"),
        (6, T, "2024-01-01T09:33:00", "line 6: timestamp '2024-01-01T09:33:00' is the same time as line 5's"),
        (
            6,
            T,
            "2024-01-01T09:32:00",
            "line 6: timestamp '2024-01-01T09:32:00' is before line 5's '2024-01-01T09:33:00'",
        ),
        (3, T, "2024-01-01T09:30:00", "line 3: .* is the same time as line 2's"),
        (41, T, "2023-12-31", "line 41: timestamp '2023-12-31' is before line 40's"),
        (4, HIGH, "100", "line 4: high '100' is below low '101.0'"),
        (4, HIGH, "102.4", "line 4: high '102.4' is below close '102.5'"),
        (4, OPEN, "104", "line 4: high '103.5' is below open '104'"),
        (4, LOW, "102.1", "line 4: low '102.1' is above open '102.0'"),
        (4, CLOSE, "100.5", "line 4: low '101.0' is above close '100.5'"),
        (4, OPEN, "inf", "line 4: open 'inf' is not a finite positive price"),
        (4, LOW, "0", "line 4: low '0' is not a finite positive price"),
        (4, LOW, "-1", "line 4: low '-1' is not a finite positive price"),
        (7, VOLUME, "-1", "line 7: volume '-1' is not a finite number >= 0"),
        (7, VOLUME, "nan", "line 7: volume 'nan' is not a finite number >= 0"),
        (7, VOLUME, "inf", "line 7: volume 'inf'"),
        (7, VOLUME, "", "line 7: volume '' is not a number"),
        (41, CLOSE, "x", "line 41: close 'x' is not a number"),
    ],
)
def test_bad_bar_is_refused_with_its_line(tmp_path, line, column, value, message):
    path = write(tmp_path / "bars.csv", edited(bar_rows(40), line, column, value))
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}, {message}"):
        read_bars_csv(path)


def test_consistent_edge_bars_load(tmp_path):
    """high == low == open == close and a volume of 0 are a valid bar."""
    rows = bar_rows(3)
    rows[1][1:] = ["101", "101", "101", "101", "0"]
    assert read_bars_csv(write(tmp_path / "bars.csv", rows)).close.tolist() == [100.5, 101.0, 102.5]


def test_line_numbers_count_blank_lines_and_the_header(tmp_path):
    rows = bar_rows(6)
    lines = [HEADER, ",".join(rows[0]), "", ",".join(rows[1]), " , ,", ",".join(rows[2]), ",".join(rows[2])]
    path = tmp_path / "bars.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="line 7: .* is the same time as line 6's"):
        read_bars_csv(path)


def test_newest_first_file(tmp_path):
    path = write(tmp_path / "bars.csv", bar_rows(30)[::-1])
    with pytest.raises(ValueError, match=r"line 3: timestamp .* is before line 2's .*newest-first file\?"):
        read_bars_csv(path)
    # two bars, newest first
    with pytest.raises(ValueError, match="line 3: .*newest-first"):
        read_bars_csv(write(tmp_path / "two.csv", bar_rows(2)[::-1]))


@pytest.mark.parametrize(
    "edit",
    [
        lambda rows: rows[:10] + rows[10:][::-1],  # descending to line 12, then rising
        lambda rows: rows + [rows[-1]],  # descending, then the last bar twice
        lambda rows: edited(rows, 20, CLOSE, "x"),  # descending, with a bad bar later
    ],
)
def test_partly_descending_file_is_refused_at_its_second_bar(tmp_path, edit):
    """The first bad line is the second bar, and the file is not called newest-first."""
    path = write(tmp_path / "bars.csv", edit(bar_rows(30)[::-1]))
    with pytest.raises(ValueError, match="line 3: timestamp .* is before line 2's .*: bars must be oldest first") as e:
        read_bars_csv(path)
    assert "newest-first" not in str(e.value)


def test_epoch_seconds_file(tmp_path):
    rows = bar_rows(5)
    for i, row in enumerate(rows):
        row[0] = str(1_700_000_000 + 60 * i)
    bars = read_bars_csv(write(tmp_path / "bars.csv", rows))
    assert bars.time_ns.tolist() == [(1_700_000_000 + 60 * i) * 10**9 for i in range(5)]


def test_offsets_order_by_utc(tmp_path):
    """10:00+01:00 is before 09:30Z: the offsets are applied before the order is checked."""
    rows = bar_rows(2)
    rows[0][0], rows[1][0] = "2024-01-01T10:00:00+01:00", "2024-01-01T09:30:00Z"
    bars = read_bars_csv(write(tmp_path / "bars.csv", rows))
    assert bars.time_ns.tolist() == [ns(2024, 1, 1, 9), ns(2024, 1, 1, 9, 30)]
    rows[1][0] = "2024-01-01T08:59:00Z"
    with pytest.raises(ValueError, match="line 3: timestamp '2024-01-01T08:59:00Z' is before line 2's"):
        read_bars_csv(write(tmp_path / "bad.csv", rows))


def test_refused_file_makes_no_environment(tmp_path):
    """A bad last bar refuses the whole file: no prefix of it is ever used."""
    rows = bar_rows(300)
    path = write(tmp_path / "bars.csv", edited(rows, 301, HIGH, "1"))
    with pytest.raises(ValueError, match="line 301: high '1' is below low"):
        MarketEnv.from_source(1, "cpu", data=str(path))
    with pytest.raises(ValueError, match="line 301"):
        load_bars_csv(path)
    assert torch.equal(load_bars_csv(write(path, rows)), torch.tensor(closes_by_csv(path), dtype=torch.float64))

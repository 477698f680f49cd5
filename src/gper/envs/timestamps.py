"""Timestamps of bar files, read as int64 nanoseconds since the Unix epoch (1970-01-01T00:00:00Z).

Two kinds of column, told apart by their first timestamp; every later one must be of the same kind:

- ISO 8601 dates and times: ``2020-01-31`` (midnight), or the basic form ``20200131``, optionally
  followed by ``T`` (or a space) and ``09:30``, ``09:30:15`` or ``09:30:15.123456789`` (a fraction of
  up to 9 digits is kept to the nanosecond, any further digits are dropped; ``,`` may stand for
  ``.``), then optionally a UTC offset: ``Z``, ``+01:00``, ``-0530``. Times with an offset are
  converted to UTC. Times without one are taken as they are written, i.e. as UTC clock times, so a
  file in local time keeps its local calendar. A column cannot mix the two: a time without an
  offset has no defined place among times with one.
- Unix epoch seconds: a decimal number such as ``1580463000`` or ``1580463000.25`` (no exponent).
  A first timestamp of 8 digits is a basic ISO date, never epoch seconds (which would be in 1970-1973).

int64 nanoseconds hold 1677-09-21 to 2262-04-11, so epoch milliseconds (about 1.6e12 today) are
refused as out of range rather than read as the year 52,000. numpy reads the values as
``datetime64[ns]``, e.g. ``np.asarray(t).astype("datetime64[ns]").astype("datetime64[M]")`` gives
each bar's calendar month.

The grammar is matched here rather than by :meth:`datetime.datetime.fromisoformat`, which accepts
different strings on Python 3.10 and 3.11 (``Z``, basic forms, fractions other than 3 or 6 digits)
and keeps microseconds only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date
from functools import lru_cache

NS_PER_SECOND = 1_000_000_000
NS_PER_DAY = 86_400 * NS_PER_SECOND
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_INT64 = (-(2**63), 2**63 - 1)

_ISO = re.compile(
    r"(?P<y>\d{4})(?P<sep>-?)(?P<m>\d{2})(?P=sep)(?P<d>\d{2})"
    r"(?:[Tt ](?P<H>\d{2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:[.,](?P<f>\d+))?)?"
    r" ?(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<oh>\d{2}):?(?P<om>\d{2}))?)?"
)
_EPOCH = re.compile(r"(?P<sign>[+-]?)(?P<int>\d*)(?:\.(?P<f>\d*))?")

ISO_EXAMPLES = "2020-01-31, 2020-01-31T09:30:00, 2020-01-31 09:30:00.5+01:00"


def _fraction_ns(digits: str | None) -> int:
    """Nanoseconds of the digits after a decimal point: '5' is 500_000_000, digits past 9 dropped."""
    return int(digits[:9].ljust(9, "0")) if digits else 0


def _in_range(ns: int, cell: str) -> int:
    if not _INT64[0] <= ns <= _INT64[1]:
        raise ValueError(f"timestamp {cell!r} is outside 1677-09-21..2262-04-11 (int64 nanoseconds)")
    return ns


@lru_cache(maxsize=1024)
def _days(year: str, month: str, day: str) -> int:
    """Days since the epoch of a date (cached: the bars of a day share it); ValueError if there is no such date."""
    return date(int(year), int(month), int(day)).toordinal() - _EPOCH_ORDINAL


def _iso_ns(match: re.Match[str], cell: str) -> int:
    """Nanoseconds since the epoch of a matched ISO date or time; ValueError for a date or time that does not exist."""
    year, _, month, day, hour, minute, second, fraction, _, sign, offset_h, offset_m = match.groups()
    try:
        ns = _days(year, month, day) * NS_PER_DAY
    except ValueError:
        raise ValueError(f"timestamp {cell!r} is not a calendar date") from None
    if hour is not None:
        hour, minute, second = int(hour), int(minute), int(second or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise ValueError(f"timestamp {cell!r} is not a time of day (00:00:00 to 23:59:59)")
        ns += (hour * 3600 + minute * 60 + second) * NS_PER_SECOND + _fraction_ns(fraction)
        if sign is not None:
            offset_h, offset_m = int(offset_h), int(offset_m)
            if offset_h > 23 or offset_m > 59:
                raise ValueError(f"timestamp {cell!r} has no valid UTC offset (-23:59 to +23:59)")
            offset = (offset_h * 3600 + offset_m * 60) * NS_PER_SECOND
            ns += -offset if sign == "+" else offset
    return _in_range(ns, cell)


def _has_offset(match: re.Match[str]) -> bool:
    return match.group("z") is not None or match.group("sign") is not None


def _epoch_ns(cell: str) -> int | None:
    """Nanoseconds of epoch seconds written as a decimal number, or None if ``cell`` is not one."""
    match = _EPOCH.fullmatch(cell)
    if match is None or not (match.group("int") or match.group("f")):
        return None
    ns = int(match.group("int") or 0) * NS_PER_SECOND + _fraction_ns(match.group("f"))
    if ns > _INT64[1] + (match.group("sign") == "-"):
        raise ValueError(f"timestamp {cell!r} is out of range for epoch seconds (epoch milliseconds?)")
    return -ns if match.group("sign") == "-" else ns


def timestamp_parser(first: str) -> Callable[[str], int]:
    """A function that reads a column's timestamps, of the kind of its first one, ``first``.

    The function takes a stripped cell and returns int nanoseconds since the epoch; it raises
    ValueError, with a message that quotes the cell, for a cell of another kind or none.

    Raises:
        ValueError: if ``first`` is neither an ISO date or time nor epoch seconds.
    """
    first_iso = _ISO.fullmatch(first)
    if first_iso is None and _epoch_ns(first) is not None:

        def parse_epoch(cell: str) -> int:
            ns = _epoch_ns(cell)
            if ns is None:
                raise ValueError(f"timestamp {cell!r} is not epoch seconds like the first bar's {first!r}")
            return ns

        return parse_epoch
    if first_iso is None:
        raise ValueError(f"timestamp {first!r} is neither an ISO 8601 date or time ({ISO_EXAMPLES}) nor epoch seconds")
    first_has_offset = _has_offset(first_iso)

    def parse_iso(cell: str) -> int:
        match = _ISO.fullmatch(cell)
        if match is None:
            raise ValueError(f"timestamp {cell!r} is not an ISO 8601 date or time ({ISO_EXAMPLES})")
        if _has_offset(match) != first_has_offset:
            this, first_one = ("no", "one") if first_has_offset else ("a", "none")
            raise ValueError(
                f"timestamp {cell!r} has {this} UTC offset and the first bar's {first!r} has {first_one}: "
                "a file's times all have one or none"
            )
        return _iso_ns(match, cell)

    parse_iso(first)
    return parse_iso


__all__ = ["NS_PER_DAY", "NS_PER_SECOND", "timestamp_parser"]

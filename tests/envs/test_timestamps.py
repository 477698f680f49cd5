"""Timestamps of bar files: every ISO 8601 form and epoch-seconds form that is accepted, to the
nanosecond, and each refusal."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gper.envs.timestamps import timestamp_parser

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def ns(*args: int, tz: timezone = timezone.utc) -> int:
    """Nanoseconds since the epoch of ``datetime(*args)``, to the microsecond."""
    return (datetime(*args, tzinfo=tz) - EPOCH) // timedelta(microseconds=1) * 1000


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("2020-01-31", ns(2020, 1, 31)),
        ("20200131", ns(2020, 1, 31)),
        ("2020-01-31T09:30", ns(2020, 1, 31, 9, 30)),
        ("2020-01-31t09:30", ns(2020, 1, 31, 9, 30)),
        ("2020-01-31 09:30:15", ns(2020, 1, 31, 9, 30, 15)),
        ("2020-01-31T09:30:15.5", ns(2020, 1, 31, 9, 30, 15, 500_000)),
        ("2020-01-31T09:30:15,123456", ns(2020, 1, 31, 9, 30, 15, 123_456)),
        # nanoseconds are kept; digits past the ninth are dropped
        ("2020-01-31T09:30:15.123456789", ns(2020, 1, 31, 9, 30, 15, 123_456) + 789),
        ("2020-01-31T09:30:15.1234567891", ns(2020, 1, 31, 9, 30, 15, 123_456) + 789),
        ("1969-12-31T23:59:59", -(10**9)),
        ("1677-09-22", ns(1677, 9, 22)),
        ("2262-04-11", ns(2262, 4, 11)),
    ],
)
def test_iso_timestamps_without_offset(cell, expected):
    assert timestamp_parser(cell)(cell) == expected


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("2020-01-31T09:30:00Z", ns(2020, 1, 31, 9, 30)),
        ("2020-01-31T09:30:00z", ns(2020, 1, 31, 9, 30)),
        ("2020-01-31T10:30:00+01:00", ns(2020, 1, 31, 9, 30)),
        ("2020-01-31 10:30:00 +01:00", ns(2020, 1, 31, 9, 30)),
        ("2020-01-31T04:00-0530", ns(2020, 1, 31, 9, 30)),
        ("2020-02-01T00:30:00.25+01:00", ns(2020, 1, 31, 23, 30, 0, 250_000)),
        ("2020-01-31T09:30:00+01:00", ns(2020, 1, 31, 9, 30, tz=timezone(timedelta(hours=1)))),
    ],
)
def test_iso_timestamps_with_offset_are_utc(cell, expected):
    assert timestamp_parser(cell)(cell) == expected


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("1580463000", 1580463000 * 10**9),
        ("1580463000.25", 1580463000 * 10**9 + 250_000_000),
        ("1580463000.", 1580463000 * 10**9),
        ("+0", 0),
        ("-1.5", -1_500_000_000),
        (".5", 500_000_000),
        ("9223372036.854775807", 2**63 - 1),
        ("-9223372036.854775808", -(2**63)),
    ],
)
def test_epoch_seconds(cell, expected):
    assert timestamp_parser(cell)(cell) == expected


@pytest.mark.parametrize(
    ("first", "cell", "message"),
    [
        (None, "31/01/2020", "neither an ISO 8601 date or time .* nor epoch seconds"),
        (None, "Jan 31 2020", "neither"),
        (None, "", "neither"),
        (None, "1.58e9", "neither"),
        (None, "nan", "neither"),
        (None, "2020-01-31T09", "neither"),
        (None, "2020-0131", "neither"),
        (None, "2020-02-30", "'2020-02-30' is not a calendar date"),
        (None, "20201301", "not a calendar date"),
        (None, "2020-01-31T24:00", "not a time of day"),
        (None, "2020-01-31T09:60", "not a time of day"),
        (None, "2020-01-31T09:30:60", "not a time of day"),
        (None, "2020-01-31T09:30+24:00", "no valid UTC offset"),
        (None, "1677-09-21", "outside 1677-09-21..2262-04-11"),
        (None, "2262-04-12", "outside"),
        (None, "1580463000000", r"out of range for epoch seconds \(epoch milliseconds\?\)"),
        ("2020-01-31", "1580463000", "'1580463000' is not an ISO 8601 date or time"),
        ("1580463000", "2020-01-31", "'2020-01-31' is not epoch seconds like the first bar's '1580463000'"),
        (
            "2020-01-31T09:30",
            "2020-01-31T09:31Z",
            "'2020-01-31T09:31Z' has a UTC offset and the first bar's '2020-01-31T09:30' has none",
        ),
        (
            "2020-01-31T09:30Z",
            "2020-01-31T09:31",
            "'2020-01-31T09:31' has no UTC offset and the first bar's .* has one",
        ),
        ("2020-01-31T09:30Z", "2020-01-31", "has no UTC offset"),
    ],
)
def test_timestamp_refusals(first, cell, message):
    with pytest.raises(ValueError, match=message):
        timestamp_parser(cell if first is None else first)(cell)

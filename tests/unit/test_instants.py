"""Contract instants (SPEC §4): the fast formatter writes what the datetime formatter wrote, and
every instant it writes parses back to its milliseconds."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_core.contract.errors import EngramError
from engram_core.contract.validation import format_instant, parse_instant

LAST = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def _by_datetime(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@settings(max_examples=2000, deadline=None)
@given(st.integers(min_value=0, max_value=LAST))
def test_an_instant_is_written_as_datetime_writes_it_and_parses_back(ms: int) -> None:
    assert format_instant(ms) == _by_datetime(ms)
    assert parse_instant(format_instant(ms)) == ms


@pytest.mark.parametrize("ms", [0, 999, 1000, 951_782_400_000, 1_764_547_200_123, LAST])
def test_edges(ms: int) -> None:
    assert format_instant(ms) == _by_datetime(ms)


def test_beyond_what_datetime_holds_it_still_refuses_as_before() -> None:
    with pytest.raises((ValueError, OverflowError, OSError)):
        format_instant(LAST + 10**12)
    with pytest.raises(EngramError):
        parse_instant("10000-01-01T00:00:00.000Z")

"""Time in the query: "what did we decide last spring", "the trip about two months ago".

``parse_time`` finds one time expression in a search query and turns it into a window of valid
time, relative to the search's ``valid_as_of``; the expression is taken out of the query's text
(its words are not evidence: "march" in "in March" must not match a record about a march). The
ranking then favours records whose ``valid_time.t`` falls in the window instead of recent ones
(docs/search.md, "Time in the query"). Nothing is filtered out: a record outside the window only
loses its time bonus.

Every pattern is a plain alternation without nested repetition, so matching is linear in the
query's length (queries are untrusted input).
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import dataclass

PARSER_ID = "engram-time-in-query-v2"  # v2: "since/before/after <time>" is a bound, not a window
DAY_MS = 86_400_000

_OPEN_ENDED = ("since", "until", "till", "before", "after")
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_name) if m}
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a few": 3,
            "couple of": 2, "few": 3}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}

_MONTH_RE = "|".join(_MONTHS)
_NUMBER_RE = r"a couple of|couple of|a few|few|an|a|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\d{1,3}"
_PATTERNS = [
    ("ago", re.compile(rf"\b(?:about |around |roughly |some |like )?({_NUMBER_RE}) (day|week|month|year)s? ago\b", re.I)),
    ("relative", re.compile(r"\b(last|this|past|previous) (week|month|year)\b", re.I)),
    ("day", re.compile(r"\b(yesterday|today|tonight|this morning|last night)\b", re.I)),
    ("season", re.compile(r"\b(?:(last|this|in|during) )?(?:the )?(spring|summer|autumn|fall|winter)(?: of)?(?: (\d{4}))?\b",
                          re.I)),
    # "may" and "march" alone are verbs far more often than months: they need a preposition or a year.
    ("month", re.compile(rf"\b(?:(last|this|in|during|around|early|late|mid) )?({_MONTH_RE})(?:,? (\d{{4}}))?\b",
                         re.I)),
    ("year", re.compile(r"\b(?:in|during|around) (\d{4})\b", re.I)),
]


@dataclass(frozen=True)
class TimeWindow:
    """Valid-time window [start_ms, end_ms] a query names."""

    start_ms: int
    end_ms: int


def _ms(d: dt.datetime) -> int:
    return int(d.timestamp() * 1000)


def _month_start(year: int, month: int) -> dt.datetime:
    while month > 12:
        year, month = year + 1, month - 12
    while month < 1:
        year, month = year - 1, month + 12
    return dt.datetime(year, month, 1, tzinfo=dt.UTC)


def _months(year: int, month: int, count: int) -> TimeWindow:
    return TimeWindow(_ms(_month_start(year, month)), _ms(_month_start(year, month + count)) - 1)


def _window(kind: str, m: re.Match[str], now: dt.datetime) -> TimeWindow | None:
    now_ms = _ms(now)
    if kind == "ago":
        word = m.group(1).lower()
        n = int(word) if word.isdigit() else _NUMBERS[word]
        days = n * _UNIT_DAYS[m.group(2).lower()]
        slack = max(_UNIT_DAYS[m.group(2).lower()] / 2, days * 0.25)  # "about two months ago" is not a day
        center = now_ms - days * DAY_MS
        return TimeWindow(int(center - slack * DAY_MS), int(min(center + slack * DAY_MS, now_ms)))
    if kind == "relative":
        which, unit = m.group(1).lower(), m.group(2).lower()
        if unit == "week":
            start = (now - dt.timedelta(days=now.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
            if which != "this":
                return TimeWindow(_ms(start - dt.timedelta(days=7)), _ms(start) - 1)
            return TimeWindow(_ms(start), now_ms)
        if unit == "month":
            if which == "this":
                return TimeWindow(_ms(_month_start(now.year, now.month)), now_ms)
            return _months(now.year, now.month - 1, 1)
        year = now.year if which == "this" else now.year - 1
        return TimeWindow(_ms(dt.datetime(year, 1, 1, tzinfo=dt.UTC)), _ms(dt.datetime(year + 1, 1, 1, tzinfo=dt.UTC)) - 1)
    if kind == "day":
        word = m.group(1).lower()
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if word in ("yesterday", "last night"):
            day -= dt.timedelta(days=1)
        return TimeWindow(_ms(day), _ms(day + dt.timedelta(days=1)) - 1)
    if kind == "season":
        which, season, named_year = (m.group(1) or "").lower(), m.group(2).lower(), m.group(3)
        first = _SEASONS[season]
        if named_year:
            return _months(int(named_year), first, 3)
        # the most recent such season that has begun; "last" means the one before if we are in it
        start_year = now.year if _month_start(now.year, first) <= now else now.year - 1
        if which == "last" and _month_start(start_year, first + 3) > now:
            start_year -= 1
        return _months(start_year, first, 3)
    if kind == "month":
        which, name, named_year = (m.group(1) or "").lower(), m.group(2).lower(), m.group(3)
        if name in ("may", "march") and not which and not named_year:  # far more often a verb
            return None
        month = _MONTHS[name]
        if named_year:
            return _months(int(named_year), month, 1)
        y = now.year if _month_start(now.year, month) <= now else now.year - 1
        if which == "last" and y == now.year and month == now.month:
            y -= 1
        return _months(y, month, 1)
    if kind == "year":
        year = int(m.group(1))
        return TimeWindow(_ms(dt.datetime(year, 1, 1, tzinfo=dt.UTC)), _ms(dt.datetime(year + 1, 1, 1, tzinfo=dt.UTC)) - 1)
    return None


def parse_time(query: str, now_ms: int) -> tuple[str, TimeWindow | None]:
    """The query without its first time expression, and that expression's window (None: none)."""
    now = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.UTC)
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(query):
            if query[:m.start()].rstrip().lower().endswith(_OPEN_ENDED):
                continue  # "since March", "before 2025": a bound, not a window
            try:
                window = _window(kind, m, now)
            except (ValueError, OverflowError, OSError):  # a year datetime cannot hold
                window = None
            if window is not None and window.start_ms <= window.end_ms:
                return (query[:m.start()] + " " + query[m.end():]).strip(), window
    return query, None


def proximity(valid_t: int, window: TimeWindow) -> float:
    """1 inside the window, halving every window length (at least a week) outside it."""
    scale = max(window.end_ms - window.start_ms, 7 * DAY_MS)
    if valid_t < window.start_ms:
        return 0.5 ** ((window.start_ms - valid_t) / scale)
    if valid_t > window.end_ms:
        return 0.5 ** ((valid_t - window.end_ms) / scale)
    return 1.0

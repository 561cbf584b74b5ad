"""Tests for the cron calendar (troth.machine.calendar).

Expected instants are computed with ``datetime`` in the tests themselves, and several
tests compare against a brute-force walk (minute by minute, second by second or day by
day) using predicates written out by hand, so the search algorithm is checked against
something that shares none of its code.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from troth.machine.calendar import Cron, CronError, next_after, occurrences, parse_cron

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MS = timedelta(milliseconds=1)

Predicate = Callable[[datetime], bool]


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    """Epoch milliseconds for a UTC wall-clock time, via datetime (independent of the code)."""
    return (datetime(year, month, day, hour, minute, second, tzinfo=UTC) - EPOCH) // ONE_MS


def dt(instant_ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=instant_ms)


def brute(pred: Predicate, start: datetime, end: datetime, step: timedelta) -> list[int]:
    """Every instant in [start, end] on the ``step`` grid that satisfies ``pred``."""
    out: list[int] = []
    cur = start
    while cur <= end:
        if pred(cur):
            out.append((cur - EPOCH) // ONE_MS)
        cur += step
    return out


def sunday0(d: datetime) -> int:
    """Weekday with Sunday = 0, as cron numbers them."""
    return (d.weekday() + 1) % 7


# --------------------------------------------------------------------------- parsing


ALL_SECONDS = frozenset(range(60))
ALL_HOURS = frozenset(range(24))
ALL_DOMS = frozenset(range(1, 32))
ALL_MONTHS = frozenset(range(1, 13))
ALL_DOWS = frozenset(range(7))


def test_parse_star_everywhere() -> None:
    c = parse_cron("* * * * *")
    assert c.expression == "* * * * *"
    assert c.seconds == frozenset({0})
    assert c.minutes == ALL_SECONDS
    assert c.hours == ALL_HOURS
    assert c.days_of_month == ALL_DOMS
    assert c.months == ALL_MONTHS
    assert c.days_of_week == ALL_DOWS
    assert c.dom_star and c.dow_star


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("5", {5}),
        ("05", {5}),
        ("1-4", {1, 2, 3, 4}),
        ("*/15", {0, 15, 30, 45}),
        ("10-30/10", {10, 20, 30}),
        ("10-35/10", {10, 20, 30}),
        ("50/3", {50, 53, 56, 59}),
        ("1,2,40-42", {1, 2, 40, 41, 42}),
        ("*/20,7", {0, 20, 40, 7}),
        ("59", {59}),
        ("0", {0}),
        ("*/100", {0}),
        ("3-3", {3}),
    ],
)
def test_parse_minute_forms(field: str, expected: set[int]) -> None:
    assert parse_cron(f"{field} * * * *").minutes == frozenset(expected)


def test_parse_six_fields_has_seconds_first() -> None:
    c = parse_cron("*/10 5 4 3 2 1")
    assert c.seconds == frozenset({0, 10, 20, 30, 40, 50})
    assert c.minutes == frozenset({5})
    assert c.hours == frozenset({4})
    assert c.days_of_month == frozenset({3})
    assert c.months == frozenset({2})
    assert c.days_of_week == frozenset({1})


def test_parse_five_fields_second_is_zero() -> None:
    assert parse_cron("1 2 3 4 5").seconds == frozenset({0})


def test_parse_ranges_per_field() -> None:
    c = parse_cron("0-59 0-59 0-23 1-31 1-12 0-6")
    assert c.seconds == ALL_SECONDS
    assert c.minutes == ALL_SECONDS
    assert c.hours == ALL_HOURS
    assert c.days_of_month == ALL_DOMS
    assert c.months == ALL_MONTHS
    assert c.days_of_week == ALL_DOWS
    # Full explicit ranges still count as restricted for the OR rule.
    assert not c.dom_star and not c.dow_star


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("JAN", {1}),
        ("dec", {12}),
        ("Mar-May", {3, 4, 5}),
        ("JAN-DEC/3", {1, 4, 7, 10}),
        ("JAN,jul,12", {1, 7, 12}),
        ("FEB/5", {2, 7, 12}),
    ],
)
def test_parse_month_names(field: str, expected: set[int]) -> None:
    assert parse_cron(f"0 0 1 {field} *").months == frozenset(expected)


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("SUN", {0}),
        ("sat", {6}),
        ("Mon-Fri", {1, 2, 3, 4, 5}),
        ("0", {0}),
        ("7", {0}),
        ("5-7", {5, 6, 0}),
        ("0,7", {0}),
        ("*/2", {0, 2, 4, 6}),
        ("MON,WED,FRI", {1, 3, 5}),
        ("TUE-SAT/2", {2, 4, 6}),
        ("?", {0, 1, 2, 3, 4, 5, 6}),
    ],
)
def test_parse_day_of_week(field: str, expected: set[int]) -> None:
    assert parse_cron(f"0 0 * * {field}").days_of_week == frozenset(expected)


def test_question_mark_is_star_in_day_fields() -> None:
    c = parse_cron("0 0 ? * MON")
    assert c.dom_star and not c.dow_star
    assert c.days_of_month == ALL_DOMS
    c = parse_cron("0 0 15 * ?")
    assert c.dow_star and not c.dom_star


@pytest.mark.parametrize(
    ("dom", "dow", "dom_star", "dow_star"),
    [
        ("*", "*", True, True),
        ("?", "?", True, True),
        ("*/1", "*", True, True),
        ("*/2", "*", False, True),
        ("1-31", "*", False, True),
        ("*", "0-7", True, False),
        ("1", "1", False, False),
    ],
)
def test_star_flags(dom: str, dow: str, dom_star: bool, dow_star: bool) -> None:
    c = parse_cron(f"0 0 {dom} * {dow}")
    assert (c.dom_star, c.dow_star) == (dom_star, dow_star)


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macros(macro: str, equivalent: str) -> None:
    c, e = parse_cron(macro), parse_cron(equivalent)
    assert c.expression == macro
    fields = ("seconds", "minutes", "hours", "days_of_month", "months", "days_of_week")
    for name in (*fields, "dom_star", "dow_star"):
        assert getattr(c, name) == getattr(e, name), name


def test_whitespace_is_flexible() -> None:
    c = parse_cron("  */5 \t 1   * * *\n")
    assert c.minutes == frozenset(range(0, 60, 5))
    assert c.hours == frozenset({1})


def test_cron_is_frozen_and_comparable() -> None:
    a, b = parse_cron("*/5 * * * *"), parse_cron("*/5 * * * *")
    assert a == b
    assert hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.expression = "x"  # type: ignore[misc]


def test_impossible_day_of_month_is_fine_when_day_of_week_also_restricts() -> None:
    # OR semantics: Feb 30 never happens, but Mondays in February do.
    c = parse_cron("0 0 30 2 MON")
    assert dt(next_after(c, ms(2026, 1, 1))) == datetime(2026, 2, 2, tzinfo=UTC)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", r"^cron: empty expression$"),
        ("   \t ", r"^cron: empty expression$"),
        ("* * * *", r"expected 5 or 6 fields, got 4"),
        ("* * * * * * *", r"expected 5 or 6 fields, got 7"),
        ("*", r"expected 5 or 6 fields, got 1"),
        ("61 * * * *", r"^cron: field 'minute' value 61 out of range 0-59$"),
        ("60 * * * * *", r"field 'second' value 60 out of range 0-59"),
        ("* 24 * * *", r"field 'hour' value 24 out of range 0-23"),
        ("* * 0 * *", r"field 'day-of-month' value 0 out of range 1-31"),
        ("* * 32 * *", r"field 'day-of-month' value 32 out of range 1-31"),
        ("* * * 0 *", r"field 'month' value 0 out of range 1-12"),
        ("* * * 13 *", r"field 'month' value 13 out of range 1-12"),
        ("* * * * 8", r"field 'day-of-week' value 8 out of range 0-7"),
        ("0-60 * * * *", r"field 'minute' value 60 out of range"),
        ("*/0 * * * *", r"field 'minute' has step 0"),
        ("1-5/0 * * * *", r"field 'minute' has step 0"),
        ("*/x * * * *", r"field 'minute' has invalid step 'x'"),
        ("*/ * * * *", r"field 'minute' has invalid step ''"),
        ("*/-1 * * * *", r"field 'minute' has invalid step '-1'"),
        ("*/2/3 * * * *", r"field 'minute' has invalid step '2/3'"),
        ("5-1 * * * *", r"field 'minute' range 5-1 is reversed"),
        ("* * * DEC-JAN *", r"field 'month' range DEC-JAN is reversed"),
        ("* * * * FRI-MON", r"field 'day-of-week' range FRI-MON is reversed"),
        ("abc * * * *", r"field 'minute' has invalid token 'abc'"),
        ("-1 * * * *", r"field 'minute' has invalid token ''"),
        ("+5 * * * *", r"field 'minute' has invalid token '\+5'"),
        ("1.5 * * * *", r"field 'minute' has invalid token '1.5'"),
        ("1-2-3 * * * *", r"field 'minute' has invalid token '2-3'"),
        ("/5 * * * *", r"field 'minute' has invalid token ''"),
        ("1,,2 * * * *", r"field 'minute' has an empty list item"),
        ("1, * * * *", r"field 'minute' has an empty list item"),
        ("** * * * *", r"field 'minute' has invalid token '\*\*'"),
        ("JAN * * * *", r"field 'minute' has invalid token 'JAN'"),
        ("* * * MON *", r"field 'month' has invalid token 'MON'"),
        ("* * * * JAN", r"field 'day-of-week' has invalid token 'JAN'"),
        ("* * * * MONDAY", r"field 'day-of-week' has invalid token 'MONDAY'"),
        ("\u0665 * * * *", r"field 'minute' has invalid token"),
        ("? * * * *", r"field 'minute' does not accept '\?'"),
        ("* * * ? *", r"field 'month' does not accept '\?'"),
        ("@reboot", r"unknown macro '@reboot'"),
        ("@every 5m", r"unknown macro '@every 5m'"),
        ("@", r"unknown macro '@'"),
        ("0 0 30 2 *", r"can never fire: no day-of-month in \[30\] exists in month\(s\) \[2\]"),
        ("0 0 31 4,6,9,11 *", r"can never fire"),
        ("0 0 30,31 FEB ?", r"can never fire"),
        ("0 0 0 30 2 *", r"can never fire"),
    ],
)
def test_parse_errors(expression: str, message: str) -> None:
    with pytest.raises(CronError, match=message) as info:
        parse_cron(expression)
    assert str(info.value).startswith("cron: ")


def test_cron_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cron:"):
        parse_cron("nope")


def test_non_string_is_rejected() -> None:
    with pytest.raises(CronError, match="must be a string"):
        parse_cron(None)  # type: ignore[arg-type]


def test_direct_construction_is_validated() -> None:
    base = parse_cron("0 0 1 1 *")
    with pytest.raises(CronError, match="field 'minute' allows no values"):
        Cron(
            expression="x",
            seconds=base.seconds,
            minutes=frozenset(),
            hours=base.hours,
            days_of_month=base.days_of_month,
            months=base.months,
            days_of_week=base.days_of_week,
            dom_star=True,
            dow_star=True,
        )
    with pytest.raises(CronError, match="field 'day-of-week' value 7 out of range 0-6"):
        Cron(
            expression="x",
            seconds=base.seconds,
            minutes=base.minutes,
            hours=base.hours,
            days_of_month=base.days_of_month,
            months=base.months,
            days_of_week=frozenset({7}),
            dom_star=True,
            dow_star=False,
        )
    with pytest.raises(CronError, match="can never fire"):
        Cron(
            expression="x",
            seconds=base.seconds,
            minutes=base.minutes,
            hours=base.hours,
            days_of_month=frozenset({31}),
            months=frozenset({2}),
            days_of_week=ALL_DOWS,
            dom_star=False,
            dow_star=True,
        )


# --------------------------------------------------------------------------- next_after


def nxt(expression: str, after: int) -> datetime:
    return dt(next_after(parse_cron(expression), after))


def test_every_minute() -> None:
    assert nxt("* * * * *", ms(2026, 3, 14, 15, 9, 26)) == datetime(2026, 3, 14, 15, 10, tzinfo=UTC)
    assert nxt("* * * * *", ms(2026, 12, 31, 23, 59, 59)) == datetime(2027, 1, 1, tzinfo=UTC)


def test_every_five_minutes() -> None:
    c = parse_cron("*/5 * * * *")
    assert dt(next_after(c, ms(2026, 3, 14, 15, 9, 26))) == datetime(
        2026, 3, 14, 15, 10, tzinfo=UTC
    )
    assert dt(next_after(c, ms(2026, 3, 14, 23, 55, 0))) == datetime(2026, 3, 15, 0, 0, tzinfo=UTC)
    assert dt(next_after(c, ms(2026, 3, 14, 23, 54, 59))) == datetime(
        2026, 3, 14, 23, 55, tzinfo=UTC
    )


def test_six_field_seconds() -> None:
    c = parse_cron("*/10 * * * * *")
    assert dt(next_after(c, ms(2026, 1, 1, 0, 0, 0))) == datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    assert dt(next_after(c, ms(2026, 1, 1, 0, 0, 55))) == datetime(2026, 1, 1, 0, 1, 0, tzinfo=UTC)
    assert dt(next_after(c, ms(2026, 1, 1, 23, 59, 50))) == datetime(2026, 1, 2, tzinfo=UTC)
    c = parse_cron("30 15 10 * * *")
    assert dt(next_after(c, ms(2026, 1, 1, 10, 15, 30))) == datetime(
        2026, 1, 2, 10, 15, 30, tzinfo=UTC
    )


def test_hourly_at_half_past() -> None:
    assert nxt("30 * * * *", ms(2026, 5, 1, 7, 10)) == datetime(2026, 5, 1, 7, 30, tzinfo=UTC)
    assert nxt("30 * * * *", ms(2026, 5, 1, 7, 30)) == datetime(2026, 5, 1, 8, 30, tzinfo=UTC)
    assert nxt("30 * * * *", ms(2026, 5, 1, 23, 45)) == datetime(2026, 5, 2, 0, 30, tzinfo=UTC)


def test_daily() -> None:
    assert nxt("@daily", ms(2026, 2, 28, 0, 0, 1)) == datetime(2026, 3, 1, tzinfo=UTC)
    assert nxt("0 9 * * *", ms(2026, 2, 28, 8, 59, 59)) == datetime(2026, 2, 28, 9, tzinfo=UTC)
    assert nxt("0 9 * * *", ms(2024, 2, 28, 9, 0, 0)) == datetime(2024, 2, 29, 9, tzinfo=UTC)


def test_weekly_by_name() -> None:
    # 2026-01-01 is a Thursday.
    assert nxt("0 8 * * MON", ms(2026, 1, 1)) == datetime(2026, 1, 5, 8, tzinfo=UTC)
    assert nxt("0 8 * * mon", ms(2026, 1, 5, 8)) == datetime(2026, 1, 12, 8, tzinfo=UTC)
    assert nxt("0 0 * * SUN", ms(2026, 1, 1)) == datetime(2026, 1, 4, tzinfo=UTC)
    assert nxt("0 0 * * 7", ms(2026, 1, 1)) == datetime(2026, 1, 4, tzinfo=UTC)
    assert nxt("@weekly", ms(2026, 1, 4)) == datetime(2026, 1, 11, tzinfo=UTC)
    assert nxt("0 17 * * MON-FRI", ms(2026, 1, 2, 17)) == datetime(2026, 1, 5, 17, tzinfo=UTC)


def test_month_end_skips_short_months() -> None:
    c = parse_cron("0 0 31 * *")
    got = [dt(t) for t in occurrences(c, ms(2026, 1, 1), ms(2026, 12, 31))]
    assert [d.month for d in got] == [1, 3, 5, 7, 8, 10, 12]
    assert all(d.day == 31 for d in got)
    assert dt(next_after(c, ms(2026, 1, 31))) == datetime(2026, 3, 31, tzinfo=UTC)


def test_leap_day_jumps_to_next_leap_year() -> None:
    c = parse_cron("0 0 29 2 *")
    assert dt(next_after(c, ms(2024, 2, 29))) == datetime(2028, 2, 29, tzinfo=UTC)
    assert dt(next_after(c, ms(2025, 6, 1))) == datetime(2028, 2, 29, tzinfo=UTC)
    # 2100 is not a leap year: an eight-year gap, still found.
    assert dt(next_after(c, ms(2096, 3, 1))) == datetime(2104, 2, 29, tzinfo=UTC)
    # 2000 is.
    assert dt(next_after(c, ms(1997, 1, 1))) == datetime(2000, 2, 29, tzinfo=UTC)


def test_dom_dow_or_semantics() -> None:
    # "the 13th, or any Friday" -- not "Friday the 13th".
    c = parse_cron("0 0 13 * FRI")
    got = [dt(t).date().isoformat() for t in occurrences(c, ms(2026, 2, 1), ms(2026, 2, 28))]
    assert got == ["2026-02-06", "2026-02-13", "2026-02-20", "2026-02-27"]
    got = [dt(t).date().isoformat() for t in occurrences(c, ms(2026, 3, 1), ms(2026, 3, 31))]
    assert got == ["2026-03-06", "2026-03-13", "2026-03-20", "2026-03-27"]
    c = parse_cron("0 0 1,15 * MON")
    got = [dt(t).date().isoformat() for t in occurrences(c, ms(2026, 6, 1), ms(2026, 6, 30))]
    assert got == ["2026-06-01", "2026-06-08", "2026-06-15", "2026-06-22", "2026-06-29"]


def test_one_day_field_star_means_only_the_other_restricts() -> None:
    c = parse_cron("0 0 * * FRI")
    got = occurrences(c, ms(2026, 2, 1), ms(2026, 2, 28))
    assert all(dt(t).weekday() == 4 for t in got) and len(got) == 4
    c = parse_cron("0 0 13 * ?")
    got = occurrences(c, ms(2026, 1, 1), ms(2026, 12, 31))
    assert all(dt(t).day == 13 for t in got) and len(got) == 12


def test_stepped_dom_star_is_restricted() -> None:
    # '*/2' restricts (robfig/cron semantics): odd days OR Mondays.
    c = parse_cron("0 0 */2 * MON")
    got = [dt(t).day for t in occurrences(c, ms(2026, 6, 1), ms(2026, 6, 14))]
    assert got == [1, 3, 5, 7, 8, 9, 11, 13]


def test_strictly_after_an_exact_occurrence() -> None:
    c = parse_cron("*/5 * * * *")
    t = ms(2026, 1, 1, 12, 5)
    assert next_after(c, t) == t + 5 * 60_000
    assert next_after(c, t - 1) == t
    c = parse_cron("* * * * * *")
    assert next_after(c, t) == t + 1000
    assert next_after(c, t - 1) == t


def test_non_second_aligned_input() -> None:
    c = parse_cron("* * * * * *")
    t = ms(2026, 1, 1)
    assert next_after(c, t + 1) == t + 1000
    assert next_after(c, t + 999) == t + 1000
    assert next_after(c, t - 999) == t
    c = parse_cron("*/5 * * * *")
    assert next_after(c, t + 123) == t + 300_000
    assert next_after(c, t - 1) == t
    assert next_after(c, t + 300_000 - 1) == t + 300_000


def test_results_are_whole_seconds() -> None:
    rng = random.Random(7)
    for expression in ("* * * * * *", "*/7 * * * * *", "13 * * * *", "@monthly"):
        c = parse_cron(expression)
        for _ in range(50):
            t = next_after(c, rng.randrange(-(10**12), 10**13))
            assert t % 1000 == 0


def test_before_the_epoch() -> None:
    assert nxt("@yearly", ms(1969, 6, 1)) == datetime(1970, 1, 1, tzinfo=UTC)
    assert nxt("0 0 29 2 *", ms(1901, 1, 1)) == datetime(1904, 2, 29, tzinfo=UTC)
    assert nxt("* * * * * *", -1) == datetime(1970, 1, 1, tzinfo=UTC)
    assert nxt("* * * * * *", -1001) == datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)


def test_year_rollover_with_month_restriction() -> None:
    assert nxt("0 0 1 JAN,JUL *", ms(2026, 7, 1)) == datetime(2027, 1, 1, tzinfo=UTC)
    assert nxt("0 0 * 3 *", ms(2026, 3, 31, 0, 0, 1)) == datetime(2027, 3, 1, tzinfo=UTC)
    assert nxt("59 59 23 31 12 *", ms(2026, 1, 1)) == datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)


def test_next_after_is_fast() -> None:
    # Far jumps must not step through time; "well under 100 us" per call on the hot path.
    cases = [parse_cron(e) for e in ("0 0 29 2 *", "59 59 23 31 12 *", "* * * * *", "0 0 13 * FRI")]
    start = time.perf_counter()
    for c in cases:
        for i in range(500):
            next_after(c, ms(2024, 3, 1) + i * 7_777_777)
    per_call = (time.perf_counter() - start) / (len(cases) * 500)
    assert per_call < 0.001  # generous bound against slow CI; typical is a few us


# --------------------------------------------------------------------------- occurrences


def test_occurrences_inclusive_bounds() -> None:
    c = parse_cron("*/5 * * * *")
    since, now = ms(2026, 1, 1, 0, 0), ms(2026, 1, 1, 0, 20)
    assert occurrences(c, since, now) == [since + k * 300_000 for k in range(5)]
    # One ms either side excludes the boundary occurrence.
    assert occurrences(c, since + 1, now - 1) == [since + k * 300_000 for k in range(1, 4)]
    # since == now == occurrence.
    assert occurrences(c, since, since) == [since]


def test_occurrences_is_the_next_after_chain() -> None:
    c = parse_cron("7,31 */3 * * *")
    since, now = ms(2026, 1, 30), ms(2026, 2, 3)
    got = occurrences(c, since, now)
    chain = [next_after(c, since - 1)]
    while next_after(c, chain[-1]) <= now:
        chain.append(next_after(c, chain[-1]))
    assert got == chain
    assert got == sorted(set(got))


def test_occurrences_empty_cases() -> None:
    c = parse_cron("0 0 * * *")
    assert occurrences(c, ms(2026, 1, 1, 1), ms(2026, 1, 1, 23)) == []
    assert occurrences(c, ms(2026, 1, 2), ms(2026, 1, 1)) == []
    assert occurrences(c, ms(2026, 1, 1), ms(2026, 1, 5), limit=0) == []


def test_occurrences_limit() -> None:
    c = parse_cron("* * * * * *")
    since = ms(2026, 1, 1)
    year_later = ms(2027, 1, 1)
    got = occurrences(c, since, year_later)
    assert len(got) == 10_000
    assert got[0] == since and got[-1] == since + 9_999_000
    got = occurrences(c, since, year_later, limit=3)
    assert got == [since, since + 1000, since + 2000]
    with pytest.raises(ValueError, match="limit"):
        occurrences(c, since, year_later, limit=-1)


def test_occurrences_long_span_is_fast() -> None:
    c = parse_cron("0 0 29 2 *")
    start = time.perf_counter()
    got = occurrences(c, ms(1904, 1, 1), ms(2404, 1, 1))
    assert time.perf_counter() - start < 1.0
    expected = [ms(y, 2, 29) for y in range(1904, 2404, 4) if y % 100 != 0 or y % 400 == 0]
    assert got == expected


# --------------------------------------------------------------------------- brute force


MINUTE_CASES: list[tuple[str, Predicate]] = [
    ("* * * * *", lambda d: True),
    ("*/5 * * * *", lambda d: d.minute % 5 == 0),
    ("30 * * * *", lambda d: d.minute == 30),
    ("5/20 * * * *", lambda d: d.minute in (5, 25, 45)),
    ("15 9-17/2 * * *", lambda d: d.minute == 15 and d.hour in (9, 11, 13, 15, 17)),
    ("0,30 8 * * MON-FRI", lambda d: d.minute in (0, 30) and d.hour == 8 and d.weekday() < 5),
    ("0 0 * * SUN", lambda d: (d.minute, d.hour) == (0, 0) and sunday0(d) == 0),
    (
        "0 12 1,15 * WED",
        lambda d: (d.minute, d.hour) == (0, 12) and (d.day in (1, 15) or sunday0(d) == 3),
    ),
    (
        "*/7 */3 * * 5-7",
        lambda d: d.minute % 7 == 0 and d.hour % 3 == 0 and sunday0(d) in (5, 6, 0),
    ),
    ("59 23 28-31 * *", lambda d: (d.minute, d.hour) == (59, 23) and d.day >= 28),
    ("0 * 29 FEB *", lambda d: d.minute == 0 and (d.month, d.day) == (2, 29)),
    ("@hourly", lambda d: d.minute == 0),
    ("@daily", lambda d: (d.minute, d.hour) == (0, 0)),
    ("@monthly", lambda d: (d.minute, d.hour, d.day) == (0, 0, 1)),
    ("@yearly", lambda d: (d.minute, d.hour, d.day, d.month) == (0, 0, 1, 1)),
]

# Windows crossing a leap day, a month end, and a year end.
WINDOWS = [
    (datetime(2024, 2, 27, tzinfo=UTC), datetime(2024, 3, 2, 3, 17, tzinfo=UTC)),
    (datetime(2025, 12, 30, 5, 3, tzinfo=UTC), datetime(2026, 1, 2, 23, 59, tzinfo=UTC)),
    (datetime(2026, 4, 29, tzinfo=UTC), datetime(2026, 5, 2, tzinfo=UTC)),
]


@pytest.mark.parametrize(("expression", "pred"), MINUTE_CASES, ids=[e for e, _ in MINUTE_CASES])
@pytest.mark.parametrize(("start", "end"), WINDOWS, ids=["leap", "new-year", "april-end"])
def test_brute_force_minutes(
    expression: str, pred: Predicate, start: datetime, end: datetime
) -> None:
    c = parse_cron(expression)
    expected = brute(pred, start, end, timedelta(minutes=1))
    since, now = (start - EPOCH) // ONE_MS, (end - EPOCH) // ONE_MS
    assert occurrences(c, since, now) == expected
    # Every instant in the window maps to the first expected occurrence after it.
    for k, e in enumerate(expected):
        prev = expected[k - 1] if k else since - 1
        assert next_after(c, prev) == e
        assert next_after(c, e - 1) == e
        assert next_after(c, (prev + e) // 2) == e


SECOND_CASES: list[tuple[str, Predicate]] = [
    ("*/10 * * * * *", lambda d: d.second % 10 == 0),
    ("15,45 */2 * * * *", lambda d: d.second in (15, 45) and d.minute % 2 == 0),
    ("0-5 0 * * * *", lambda d: d.second <= 5 and d.minute == 0),
    ("59 59 * * * *", lambda d: (d.second, d.minute) == (59, 59)),
    ("30 30 23 * * *", lambda d: (d.second, d.minute, d.hour) == (30, 30, 23)),
]


@pytest.mark.parametrize(("expression", "pred"), SECOND_CASES, ids=[e for e, _ in SECOND_CASES])
def test_brute_force_seconds(expression: str, pred: Predicate) -> None:
    start = datetime(2025, 12, 31, 22, 58, 3, tzinfo=UTC)
    end = datetime(2026, 1, 1, 1, 1, 1, tzinfo=UTC)
    c = parse_cron(expression)
    expected = brute(pred, start, end, timedelta(seconds=1))
    assert occurrences(c, (start - EPOCH) // ONE_MS, (end - EPOCH) // ONE_MS) == expected


DAY_CASES: list[tuple[str, Predicate]] = [
    ("0 0 31 * *", lambda d: d.day == 31),
    ("0 0 29 2 *", lambda d: (d.month, d.day) == (2, 29)),
    ("0 0 13 * FRI", lambda d: d.day == 13 or d.weekday() == 4),
    ("0 0 */10 * *", lambda d: d.day in (1, 11, 21, 31)),
    ("0 0 * JAN,JUL MON", lambda d: d.month in (1, 7) and d.weekday() == 0),
    ("0 0 30 2 SAT", lambda d: d.month == 2 and d.weekday() == 5),
    ("0 0 29,30 2,4 *", lambda d: d.month in (2, 4) and d.day in (29, 30)),
    ("0 0 1-7 * 1", lambda d: d.day <= 7 or d.weekday() == 0),
    ("0 0 ? 6-8 SAT,SUN", lambda d: 6 <= d.month <= 8 and d.weekday() >= 5),
]


@pytest.mark.parametrize(("expression", "pred"), DAY_CASES, ids=[e for e, _ in DAY_CASES])
def test_brute_force_days(expression: str, pred: Predicate) -> None:
    start = datetime(2095, 1, 1, tzinfo=UTC)
    end = datetime(2106, 12, 31, tzinfo=UTC)
    c = parse_cron(expression)
    expected = brute(pred, start, end, timedelta(days=1))
    got = occurrences(c, (start - EPOCH) // ONE_MS, (end - EPOCH) // ONE_MS)
    assert got == expected


def test_random_instants_against_forward_scan() -> None:
    """From random instants (not aligned), next_after equals a naive forward scan."""
    rng = random.Random(20260401)
    friday_13: Predicate = lambda d: (d.hour, d.minute) == (0, 0) and DAY_CASES[2][1](d)  # noqa: E731
    cases = [*MINUTE_CASES[:9], ("0 0 13 * FRI", friday_13)]
    for expression, pred in cases:
        c = parse_cron(expression)
        for _ in range(20):
            after = rng.randrange(ms(1890, 1, 1), ms(2300, 1, 1))
            # First whole minute strictly after `after`, then scan forward.
            cur = dt(after).replace(second=0, microsecond=0) + timedelta(minutes=1)
            while not pred(cur):
                cur += timedelta(minutes=1)
            assert dt(next_after(c, after)) == cur, (expression, after)

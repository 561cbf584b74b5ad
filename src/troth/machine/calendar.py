"""Cron calendar for schedules: parse cron expressions and find when they fire.

Schedules in a durable-promise server fire promises on a cron calendar. The server only
ever needs two questions answered: "when is the next firing after this instant?" and
"which firings did we miss between these two instants?" (for catch-up after downtime).
Both are answered here without third-party packages, over integer UNIX epoch
milliseconds in UTC, which is the server's one representation of time.

Syntax (Vixie cron, plus an optional leading seconds field):

* 5 fields: ``minute hour day-of-month month day-of-week`` (second is 0).
* 6 fields: ``second minute hour day-of-month month day-of-week`` (seconds FIRST, as in
  robfig/cron; not seconds-last as in the ``croniter`` package).
* Per field: ``*``, numbers, ``a-b``, ``*/n``, ``a-b/n``, ``a/n`` (a to the field's max),
  and comma lists of those. ``?`` means ``*`` and is accepted only in the two day fields.
  Month names ``JAN``-``DEC`` and weekday names ``SUN``-``SAT`` (case-insensitive).
  Day-of-week is 0-7, where both 0 and 7 are Sunday.
* Macros: ``@yearly``/``@annually``, ``@monthly``, ``@weekly``, ``@daily``/``@midnight``,
  ``@hourly``.

Day semantics follow Vixie cron: when both day fields are restricted a day matches if
EITHER matches; when one of them is ``*`` (or ``?``) only the other one restricts.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Cron", "CronError", "next_after", "occurrences", "parse_cron"]


class CronError(ValueError):
    """A cron expression is malformed or can never fire.

    Subclasses ValueError so callers validating user input can catch either; the message
    always starts with ``cron:`` and names the offending field or token, because it is
    meant to be shown to whoever wrote the schedule.
    """


# Longest gap between two occurrences of any schedule that Cron accepts: Feb 29 can be
# eight years apart (2096 -> 2104, since 2100 is not a leap year). Searching a little
# beyond that guarantees every valid schedule is found, while still bounding the work
# for a Cron that was hand-built into something impossible.
_HORIZON_YEARS = 10

# Max days per month over all years (Feb counts 29), used to reject e.g. "Feb 30".
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

_MONTH_NAMES = {
    name: number
    for number, name in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"),
        start=1,
    )
}
_DOW_NAMES = {
    name: number for number, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))
}

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True)
class _FieldSpec:
    """Bounds and vocabulary of one cron field, so one parser serves all six."""

    name: str
    low: int
    high: int
    names: dict[str, int] = field(default_factory=dict)
    allow_question: bool = False


_SECOND = _FieldSpec("second", 0, 59)
_MINUTE = _FieldSpec("minute", 0, 59)
_HOUR = _FieldSpec("hour", 0, 23)
_DOM = _FieldSpec("day-of-month", 1, 31, allow_question=True)
_MONTH = _FieldSpec("month", 1, 12, _MONTH_NAMES)
# 0-7 so that "7" and ranges such as "5-7" work; 7 is folded into 0 after parsing.
_DOW = _FieldSpec("day-of-week", 0, 7, _DOW_NAMES, allow_question=True)


@dataclass(frozen=True)
class Cron:
    """A parsed cron schedule: the set of allowed values for each calendar field.

    Build it with :func:`parse_cron`. Sets are used (rather than the text) so that the
    search in :func:`next_after` is a handful of lookups per call. ``days_of_week`` uses
    0=Sunday .. 6=Saturday. ``dom_star``/``dow_star`` record whether the day fields were
    written as ``*``/``?``, which is what decides OR versus single-field day matching, and
    cannot be recovered from the sets alone (``1-31`` restricts, ``*`` does not).
    """

    expression: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]
    dom_star: bool
    dow_star: bool
    # Derived lookup tables, computed once so the hot path does no sorting.
    _seconds: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _minutes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _hours: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _doms: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _months: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # _dow_skip[w] = days from weekday w to the nearest allowed weekday (0 if w allowed).
    _dow_skip: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Validate and precompute.

        Validation lives here rather than only in the parser so that a hand-built Cron
        cannot send :func:`next_after` searching for something that does not exist.
        """
        checks = (
            (_SECOND, self.seconds, 59),
            (_MINUTE, self.minutes, 59),
            (_HOUR, self.hours, 23),
            (_DOM, self.days_of_month, 31),
            (_MONTH, self.months, 12),
            (_DOW, self.days_of_week, 6),
        )
        for spec, values, high in checks:
            if not values:
                raise CronError(f"cron: field {spec.name!r} allows no values")
            bad = [v for v in values if not spec.low <= v <= high]
            if bad:
                raise CronError(
                    f"cron: field {spec.name!r} value {min(bad)} out of range {spec.low}-{high}"
                )
        if self.dow_star and not any(
            day <= _MAX_DAYS[month] for month in self.months for day in self.days_of_month
        ):
            raise CronError(
                f"cron: schedule {self.expression!r} can never fire: no day-of-month in "
                f"{sorted(self.days_of_month)} exists in month(s) {sorted(self.months)}"
            )
        setattr_ = object.__setattr__
        setattr_(self, "_seconds", tuple(sorted(self.seconds)))
        setattr_(self, "_minutes", tuple(sorted(self.minutes)))
        setattr_(self, "_hours", tuple(sorted(self.hours)))
        setattr_(self, "_doms", tuple(sorted(self.days_of_month)))
        setattr_(self, "_months", tuple(sorted(self.months)))
        setattr_(
            self,
            "_dow_skip",
            tuple(next(k for k in range(7) if (w + k) % 7 in self.days_of_week) for w in range(7)),
        )


# --------------------------------------------------------------------------- parsing


def parse_cron(expression: str) -> Cron:
    """Parse a 5- or 6-field cron expression or an ``@`` macro into a :class:`Cron`.

    Raises :class:`CronError` for anything malformed, and for schedules whose
    day-of-month/month combination can never occur (e.g. ``0 0 30 2 *``), so that bad
    schedules are refused when they are created rather than when they are due.
    """
    if not isinstance(expression, str):
        raise CronError(f"cron: expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise CronError("cron: empty expression")
    if text.startswith("@"):
        macro = _MACROS.get(text.lower())
        if macro is None:
            known = ", ".join(sorted(_MACROS))
            raise CronError(f"cron: unknown macro {text!r} (expected one of {known})")
        text = macro
    parts = text.split()
    if len(parts) == 5:
        parts.insert(0, "0")
    elif len(parts) != 6:
        raise CronError(f"cron: expected 5 or 6 fields, got {len(parts)} in {expression!r}")
    second, minute, hour, dom, month, dow = parts
    days_of_week = frozenset(v % 7 for v in _parse_field(_DOW, dow))
    return Cron(
        expression=expression,
        seconds=_parse_field(_SECOND, second),
        minutes=_parse_field(_MINUTE, minute),
        hours=_parse_field(_HOUR, hour),
        days_of_month=_parse_field(_DOM, dom),
        months=_parse_field(_MONTH, month),
        days_of_week=days_of_week,
        dom_star=_is_star(dom),
        dow_star=_is_star(dow),
    )


def _is_star(text: str) -> bool:
    """Whether a day field is unrestricted for the OR rule.

    Only a bare ``*``/``?`` (or with the no-op step ``/1``) counts; ``*/2`` restricts,
    matching robfig/cron (the Resonate reference server's library) rather than Vixie's
    quirk of treating anything starting with ``*`` as unrestricted.
    """
    return text in ("*", "?", "*/1", "?/1")


def _parse_field(spec: _FieldSpec, text: str) -> frozenset[int]:
    """Expand one field (a comma list of items) into the set of values it allows."""
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"cron: field {spec.name!r} has an empty list item in {text!r}")
        values.update(_parse_item(spec, item))
    return frozenset(values)


def _parse_item(spec: _FieldSpec, item: str) -> range:
    """Expand one list item: ``*``, ``?``, ``a``, ``a-b``, each optionally ``/step``."""
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _is_digits(step_text):
            raise CronError(f"cron: field {spec.name!r} has invalid step {step_text!r} in {item!r}")
        step = int(step_text)
        if step == 0:
            raise CronError(f"cron: field {spec.name!r} has step 0 in {item!r}")
    if base in ("*", "?"):
        if base == "?" and not spec.allow_question:
            raise CronError(
                f"cron: field {spec.name!r} does not accept '?' (only day-of-month and "
                f"day-of-week do)"
            )
        low, high = spec.low, spec.high
    else:
        low_text, dash, high_text = base.partition("-")
        low = _parse_value(spec, low_text, item)
        if dash:
            high = _parse_value(spec, high_text, item)
            if low > high:
                raise CronError(
                    f"cron: field {spec.name!r} range {low_text}-{high_text} is reversed "
                    f"(start {low} > end {high})"
                )
        elif slash:
            high = spec.high  # "a/n" means "a-max/n"
        else:
            high = low
    return range(low, high + 1, step)


def _parse_value(spec: _FieldSpec, text: str, item: str) -> int:
    """Parse one number or name, checking it against the field's range."""
    if _is_digits(text):
        value = int(text)
        if not spec.low <= value <= spec.high:
            raise CronError(
                f"cron: field {spec.name!r} value {value} out of range {spec.low}-{spec.high}"
            )
        return value
    named = spec.names.get(text.upper())
    if named is not None:
        return named
    raise CronError(f"cron: field {spec.name!r} has invalid token {text!r} in {item!r}")


def _is_digits(text: str) -> bool:
    """ASCII digits only: ``int()`` would also accept '+5', ' 5', '5_0' and non-ASCII digits."""
    return text.isascii() and text.isdigit()


# --------------------------------------------------------------------------- searching


def next_after(cron: Cron, after_ms: int) -> int:
    """Return the first occurrence of ``cron`` strictly after ``after_ms`` (epoch ms, UTC).

    Occurrences fall on whole seconds, so the answer is always a multiple of 1000 even
    when ``after_ms`` is not. The search skips whole months, days, hours and minutes that
    cannot match, so its cost does not depend on how far away the answer is.
    """
    return next(_iter_seconds(cron, after_ms // 1000 + 1)) * 1000


def occurrences(cron: Cron, since_ms: int, now_ms: int, *, limit: int = 10_000) -> list[int]:
    """Return every occurrence ``t`` with ``since_ms <= t <= now_ms``, increasing.

    This is the chain ``since`` (if it is itself an occurrence), ``next_after(since)``,
    ... capped at ``now`` and at ``limit`` items, which is what a scheduler needs to
    catch up on firings it missed. ``limit`` bounds the work and memory when the span is
    long relative to the schedule (every second for a year is 31 million firings).
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    result: list[int] = []
    if limit == 0 or since_ms > now_ms:
        return result
    # Smallest whole second >= since_ms; -(-x // 1000) is ceiling division.
    for second in _iter_seconds(cron, -(-since_ms // 1000)):
        instant = second * 1000
        if instant > now_ms:
            break
        result.append(instant)
        if len(result) >= limit:
            break
    return result


def _iter_seconds(cron: Cron, start: int) -> Iterator[int]:
    """Yield the occurrences of ``cron`` at or after epoch second ``start``, increasing.

    Walks day by matching day and, within a day, over the precomputed sorted hour,
    minute and second tuples, so consecutive occurrences cost O(1) each and the first
    one costs a few bisects. Shared by next_after and occurrences.
    """
    days, second_of_day = divmod(start, 86400)
    year, month, day = _civil_from_days(days)
    hour, rest = divmod(second_of_day, 3600)
    minute, second = divmod(rest, 60)
    hours, minutes, seconds = cron._hours, cron._minutes, cron._seconds
    while True:
        found = _next_day(cron, year, month, day)
        if found != (year, month, day):
            year, month, day = found
            hour = minute = second = 0
        base = _days_from_civil(year, month, day) * 86400
        for h in hours[bisect_left(hours, hour) :]:
            same_hour = h == hour
            for m in minutes[bisect_left(minutes, minute if same_hour else 0) :]:
                low = second if same_hour and m == minute else 0
                for s in seconds[bisect_left(seconds, low) :]:
                    yield base + h * 3600 + m * 60 + s
        hour = minute = second = 0
        day += 1  # may overflow the month; _next_day rolls it over


def _next_day(cron: Cron, year: int, month: int, day: int) -> tuple[int, int, int]:
    """Return the first matching (year, month, day) on or after the given date.

    ``day`` may be one past the end of the month. Jumps straight to the next allowed
    month when the current one is excluded, and raises CronError if nothing matches
    within the horizon (only possible for a schedule that can never fire).
    """
    months = cron._months
    last_year = year + _HORIZON_YEARS
    while year <= last_year:
        if month in cron.months:
            length = _days_in_month(year, month)
            if day <= length:
                found = _match_day(cron, year, month, day, length)
                if found is not None:
                    return year, month, found
        index = bisect_right(months, month)
        if index < len(months):
            month = months[index]
        else:
            year, month = year + 1, months[0]
        day = 1
    raise CronError(
        f"cron: schedule {cron.expression!r} has no occurrence within {_HORIZON_YEARS} years"
    )


def _match_day(cron: Cron, year: int, month: int, day: int, length: int) -> int | None:
    """First day >= ``day`` in this month that satisfies the day fields, else None."""
    if cron.dom_star and cron.dow_star:
        return day
    by_dom: int | None = None
    if not cron.dom_star:
        doms = cron._doms
        index = bisect_left(doms, day)
        if index < len(doms) and doms[index] <= length:
            by_dom = doms[index]
        if cron.dow_star:
            return by_dom
    # 1970-01-01 was a Thursday (4 with Sunday = 0).
    weekday = (_days_from_civil(year, month, day) + 4) % 7
    by_dow = day + cron._dow_skip[weekday]
    if by_dow > length:
        return by_dom
    return by_dow if by_dom is None else min(by_dom, by_dow)


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    return _MAX_DAYS[month]


# Proleptic Gregorian <-> days since 1970-01-01 (H. Hinnant's algorithms). Pure integer
# arithmetic: faster than building datetime objects and free of datetime's 1..9999
# year limits, so any int instant is accepted.


def _days_from_civil(year: int, month: int, day: int) -> int:
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    days += 719468
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = mp + (3 if mp < 10 else -9)
    year = year_of_era + era * 400 + (month <= 2)
    return year, month, day

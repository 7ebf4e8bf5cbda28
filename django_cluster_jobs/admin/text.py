"""How the admin words things: schedules, intervals, times, JSON and tracebacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cron_descriptor import Options, get_description
from django.contrib import admin
from django.db.models import Model
from django.utils import timezone, translation
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _

from ..exceptions import ImproperlyDeclared
from ..models import JobDefinition, ScheduleKind
from ..schedules import Schedule


@lru_cache(maxsize=512)
def describe_cron(expr: str, locale_code: str = "en_US") -> str:
    """Return cron-descriptor's reading of ``expr``, or ``expr`` itself when it cannot read it."""
    fields = expr.split()
    if len(fields) == 6:
        # Ours are seconds-first; a 7th (year) field stops cron-descriptor from guessing a year.
        fields.append("*")
    try:
        options = Options(locale_code=locale_code, use_24hour_time_format=True)
        return get_description(" ".join(fields), options)
    except Exception:  # a description is a nicety: never break the page over one
        return expr


def locale_code() -> str:
    """Return the active language as the locale code cron-descriptor expects (``fr_FR``)."""
    code = translation.to_locale(translation.get_language() or "en-us")
    return code if "_" in code else f"{code}_{code.upper()}"


def interval_text(interval: timedelta | None) -> str:
    """Return ``interval`` as compact units: ``1 h 30 min``, ``2 s``, ``250 ms``."""
    if interval is None:
        return "?"
    ms = int(interval / timedelta(milliseconds=1))
    units = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000), ("ms", 1))
    parts = []
    for name, size in units:
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count} {name}")
    return " ".join(parts) or "0 ms"


def schedule_text(job: JobDefinition) -> str:
    """Return a one-line, human-readable schedule of ``job``."""
    if job.schedule_kind == ScheduleKind.CRON:
        return f"{describe_cron(job.cron, locale_code())} ({job.timezone})"
    if job.schedule_kind == ScheduleKind.EVERY:
        return _("every %(interval)s") % {"interval": interval_text(job.interval)}
    if job.schedule_kind == ScheduleKind.DELAY:
        return _("%(interval)s after the previous run") % {"interval": interval_text(job.interval)}
    return str(job.get_schedule_kind_display())


def schedule_or_none(job: JobDefinition) -> Schedule | None:
    """Return the job's schedule, or None when its stored fields do not make one."""
    try:
        return job.get_schedule()
    except (ImproperlyDeclared, ValueError):
        return None


def _stamp(at: datetime, zone: tzinfo) -> str:
    return at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def when(at: datetime | None) -> str:
    """Return ``at`` to the second in the current time zone, naming the zone; else a dash."""
    return _stamp(at, timezone.get_current_timezone()) if at else "-"


def time_column(model: type[Model], field: str) -> Callable[[Any, Model], str]:
    """Return an admin column (or read-only field) showing ``field`` as :func:`when` words it.

    Django's own display of a datetime drops the seconds and the zone.
    """

    @admin.display(description=model._meta.get_field(field).verbose_name, ordering=field)
    def column(model_admin: Any, obj: Model) -> str:
        return when(getattr(obj, field))

    return column


def fire_times_table(times: list[datetime], tz: str) -> str:
    """Return ``times`` as an HTML table: one column in ``tz``, one in UTC."""
    try:
        zone = ZoneInfo(tz or "UTC")
    except (ValueError, ZoneInfoNotFoundError):
        zone, tz = UTC, "UTC"
    rows = ((_stamp(at, zone), _stamp(at, UTC)) for at in times)
    body = format_html_join("", "<tr><td>{}</td><td>{}</td></tr>", rows)
    head = format_html("<tr><th>{}</th><th>UTC</th></tr>", tz or "UTC")
    return format_html("<table><thead>{}</thead><tbody>{}</tbody></table>", head, body)


def pre(text: object) -> str:
    """Return ``text`` in a ``<pre>`` block (escaped), or a dash when there is none."""
    return format_html("<pre>{}</pre>", text) if text not in ("", None) else "-"


def as_json(value: object) -> str:
    """Return ``value`` as indented, key-sorted JSON."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def next_offset_change(tz: str, after: datetime, within: timedelta = timedelta(days=366)):
    """Return the first instant after ``after`` at which ``tz``'s UTC offset changes (a DST
    change), to the hour, within ``within``; None when there is none (or no such zone)."""
    try:
        zone = ZoneInfo(tz or "UTC")
    except (ValueError, ZoneInfoNotFoundError):
        return None
    start = after.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    offset = start.astimezone(zone).utcoffset()
    for step, count in ((timedelta(days=1), within.days), (timedelta(hours=1), 24)):
        at = start
        for _step in range(count):
            if (at + step).astimezone(zone).utcoffset() != offset:
                break
            at += step
        else:
            return None
        start = at
    return start + timedelta(hours=1)


def fire_times_around(schedule: Schedule, change: datetime, before: int = 2, after: int = 3):
    """The schedule's last ``before`` occurrences before ``change`` and first ``after`` from it."""
    earlier: list[datetime] = []
    at = change - timedelta(microseconds=1)
    while len(earlier) < before and (found := schedule.previous_at_or_before(at)) is not None:
        earlier.insert(0, found)
        at = found - timedelta(microseconds=1)
    return earlier + schedule.upcoming(change - timedelta(microseconds=1), after)

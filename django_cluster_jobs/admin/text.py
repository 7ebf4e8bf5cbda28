"""How the admin words things: times, fire times, JSON and tracebacks (schedules and
intervals: :mod:`django_cluster_jobs.wording`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.contrib import admin
from django.db.models import Field, Model
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ..exceptions import ImproperlyDeclared
from ..models import JobDefinition
from ..schedules import Schedule


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

    column_field = model._meta.get_field(field)
    label = column_field.verbose_name if isinstance(column_field, Field) else field

    @admin.display(description=label, ordering=field)
    def column(model_admin: Any, obj: Model) -> str:
        return when(getattr(obj, field))

    return column


def fire_times_table(times: list[datetime], tz: str) -> str:
    """Return ``times`` as an HTML table: one column in ``tz``, one in UTC."""
    zone: tzinfo
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

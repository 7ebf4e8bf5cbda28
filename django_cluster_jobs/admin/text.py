"""How the admin words things: times, fire times, JSON and tracebacks (schedules and
intervals: :mod:`django_cluster_jobs.wording`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
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

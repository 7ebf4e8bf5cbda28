"""How a schedule reads: the one describer the admin, the API, the status report and
``schedulerstatus`` share, with its cron and interval wording."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache

from cron_descriptor import Options, get_description
from django.utils import translation
from django.utils.translation import gettext as _

from .models import JobDefinition, ScheduleKind

#: The language of the machine-facing reports (the status report, the API, ``schedulerstatus``).
REPORT_LANGUAGE = "en-us"


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
    except Exception:  # a description is a nicety: never fail a page or a report over one
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


def describe_schedule(job: JobDefinition, language: str | None = None) -> str:
    """Return a one-line reading of the job's schedule, in ``language`` (default: the active)."""
    if language is None:
        return _describe(job)
    with translation.override(language):
        return _describe(job)


def _describe(job: JobDefinition) -> str:
    kind = job.schedule_kind
    if kind == ScheduleKind.CRON:
        return f"{describe_cron(job.cron, locale_code())} ({job.timezone})"
    if kind == ScheduleKind.EVERY:
        return _("every %(interval)s") % {"interval": interval_text(job.interval)}
    if kind == ScheduleKind.DELAY:
        return _("%(interval)s after the previous run") % {"interval": interval_text(job.interval)}
    if kind == ScheduleKind.STARTUP:
        return _("at scheduler start, on every node")
    return _("on demand only")

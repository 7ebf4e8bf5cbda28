"""The read side of the admin's cluster overview and of an occurrence's story.

``cluster_overview()`` adds to the status report (django_cluster_jobs.status) each job's last 24
hours as a strip of hourly cells, the backlog by queue and the dead letters; ``occurrence_story()``
tells what became of one occurrence of one job: not due, claimed, skipped, missed, retried, taken
over, with its runs and their timelines. Both only read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.db.models.functions import TruncHour
from django.utils.translation import gettext_lazy as _

from .coordination import get_vendor
from .models import (
    FAILURE_STATES,
    ClusterEvent,
    ClusterEventKind,
    JobDefinition,
    JobRun,
    RunEvent,
    RunState,
)
from .status import backlog, build_status, dead_letters
from .stored import tolerant
from .validation import known_names, stored_problems

HOURS = 24
#: What a cell of the strip shows for each state, the worst first.
STRIP: dict[str, str] = {
    RunState.FAILED: "failed",
    RunState.TIMED_OUT: "failed",
    RunState.DEAD: "failed",
    RunState.LOST: "failed",
    RunState.MISSED: "missed",
    RunState.SKIPPED: "skipped",
    RunState.CANCELLED: "skipped",
    RunState.PENDING: "live",
    RunState.RUNNING: "live",
    RunState.SUCCEEDED: "ran",
}
WORST_FIRST = ("failed", "missed", "skipped", "live", "ran")
#: The cluster events that say how a job changed (their detail starts with the job's name).
JOB_EVENTS = (ClusterEventKind.JOB_CHANGED, ClusterEventKind.BREAKER_OPENED)


@dataclass
class Cell:
    """One hour of one job: how many occurrences ended in each kind, and the worst kind."""

    start: datetime
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def worst(self) -> str:
        return next((kind for kind in WORST_FIRST if self.counts.get(kind)), "")

    @property
    def title(self) -> str:
        hour = f"{self.start:%Y-%m-%d %H:00} UTC"
        found = ", ".join(f"{self.counts[k]} {k}" for k in WORST_FIRST if self.counts.get(k))
        return f"{hour}: {found or 'nothing'}"


def hours(now: datetime) -> list[datetime]:
    """The starts of the last ``HOURS`` hours, oldest first, the current hour last."""
    top = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return [top - timedelta(hours=h) for h in range(HOURS - 1, -1, -1)]


def strips(alias: str, now: datetime) -> dict[str, list[Cell]]:
    """Each job's occurrences of the last 24 hours, by hour (one grouped query)."""
    starts = hours(now)
    # By job id, not name: the (scheduled_at) index holds the job and the state, so the day is
    # read from the index alone, without a join.
    rows = (
        JobRun.objects.using(alias)
        .filter(scheduled_at__gte=starts[0], scheduled_at__lte=now)
        .annotate(hour=TruncHour("scheduled_at", tzinfo=UTC))
        .values_list("job_id", "hour", "state")
        .annotate(n=Count("pk"))
        .order_by()
    )
    names = dict(JobDefinition.objects.using(alias).values_list("pk", "name"))
    cells: dict[str, dict[datetime, Cell]] = {}
    for job_id, hour, state, n in rows:
        job = cells.setdefault(names[job_id], {start: Cell(start) for start in starts})
        cell = job.get(hour.astimezone(UTC))
        if cell is not None:
            kind = STRIP.get(state, "ran")
            cell.counts[kind] = cell.counts.get(kind, 0) + n
    return {name: list(by_hour.values()) for name, by_hour in cells.items()}


def cluster_overview(alias: str, now: datetime | None = None) -> dict[str, Any]:
    """The status report plus strips, backlog and dead letters; failing and breaker-open jobs
    first, then by name."""
    # The report writes its time to the millisecond; the strips need the instant itself, or the
    # runs scheduled in the report's last millisecond would be left out of the current hour.
    now = now or get_vendor(alias).db_now()
    report = build_status(using=alias, now=now)
    by_job, letters = strips(alias, now), dead_letters(alias)
    tripped = set(
        JobDefinition.objects.using(alias).breaker_open(now).values_list("name", flat=True)
    )
    empty = [Cell(start) for start in hours(now)]
    for job in report["jobs"]:
        last = job["last_run"]
        job["failing"] = last is not None and last["state"] in FAILURE_STATES
        job["breaker_open"] = job["name"] in tripped
        job["strip"] = by_job.get(job["name"], empty)
        job["dead_letters"] = letters.get(job["name"], 0)
    report["jobs"].sort(key=lambda j: (not (j["failing"] or j["breaker_open"]), j["name"]))
    report["queues"] = [
        {"queue": q, "depth": n, "oldest_seconds": round(age, 1)}
        for q, (n, age) in sorted(backlog(alias, now).items())
    ]
    report["dead_letters"] = sum(letters.values())
    report["hours"] = hours(now)
    return report


# -- one occurrence -------------------------------------------------------------------------


VERDICTS = {
    "ran": _("It ran."),
    "failed": _("It ran and failed."),
    "live": _("It is pending or running now."),
    "skipped": _("It was skipped."),
    "missed": _("It was missed: no node fired it in time, and its misfire policy settled it."),
    "before_job": _("Not due: the job did not exist yet."),
    "no_occurrence": _(
        "The schedule has no occurrence at or before this instant, and no run "
        "of the job was scheduled at it."
    ),
    "disabled": _("Not due: the job is disabled, and no run of this occurrence exists."),
    "future": _("Not due yet: this occurrence is in the future."),
    "undecided": _("Not decided yet: no node has claimed it and the leader has not settled it."),
    "settled": _(
        "Decided without a run kept: it was not due when it came (the job was paused or "
        "disabled then, or its schedule changed), or its run was purged by retention."
    ),
}


@dataclass
class Story:
    """What became of the occurrence ``at`` of ``job``: a verdict code, its runs and timeline."""

    job: JobDefinition
    asked: datetime
    at: datetime | None
    verdict: str
    runs: list[JobRun] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)
    changes: list[ClusterEvent] = field(default_factory=list)
    #: Why no node plans the job as stored (a missing predecessor, a value the validator
    #: refuses): what keeps its occurrences from being queued, whatever the verdict.
    problems: list[str] = field(default_factory=list)

    @property
    def verdict_text(self) -> str:
        return str(VERDICTS[self.verdict])


def occurrence_story(
    alias: str, job: JobDefinition, asked: datetime, now: datetime | None = None
) -> Story:
    """Tell the story of the occurrence of ``job`` at or just before ``asked`` (``now``: the
    database's time by default)."""
    now = now or get_vendor(alias).db_now()
    at = _occurrence(job, asked)
    runs = list(tolerant(_runs(alias, job, at, asked)))
    story = Story(job, asked, at, _verdict(job, at, runs, now), runs)
    story.problems = [str(problem) for problem in stored_problems(job, known_names(alias))]
    events = RunEvent.objects.using(alias).filter(run__in=[r.pk for r in runs])
    story.events = list(tolerant(events.order_by("at", "pk")))
    around = (at or asked) - timedelta(days=1), (at or asked) + timedelta(hours=1)
    story.changes = list(
        ClusterEvent.objects.using(alias)
        .filter(Q(detail__startswith=f"{job.name}:"), at__range=around)
        .filter(kind__in=JOB_EVENTS)
        .order_by("at", "pk")
    )
    return story


def _occurrence(job: JobDefinition, asked: datetime) -> datetime | None:
    try:
        return job.get_schedule().previous_at_or_before(asked)
    except Exception:  # a stored schedule the validator refuses: tell what rows say
        return None


def _runs(alias: str, job: JobDefinition, at: datetime | None, asked: datetime) -> Any:
    runs = JobRun.objects.using(alias).filter(job=job).order_by("scheduled_at", "pk")
    return runs.filter(scheduled_at=at if at is not None else asked)


def _verdict(job: JobDefinition, at: datetime | None, runs: list[JobRun], now: datetime) -> str:
    if runs:
        kinds = {STRIP.get(run.state, "ran") for run in runs}
        return next(kind for kind in WORST_FIRST if kind in kinds)
    if at is None:
        return "no_occurrence"
    if at < job.created_at:
        return "before_job"
    if at > now:
        return "future"
    if not job.enabled:
        return "disabled"
    if at > job.settled_through:
        return "undecided"
    return "settled"

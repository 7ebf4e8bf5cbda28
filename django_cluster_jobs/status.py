"""The cluster at a glance, as one dict of JSON values: ``schedulerstatus``, an API or the admin.

``build_status()`` returns these keys (times are ISO-8601 UTC strings or null):

- ``generated_at``: the database's time the report was made at (ages are measured from it);
- ``healthy``: whether an active node heartbeated within ``dead_after_seconds`` (DEAD_AFTER);
- ``nodes``: ``node_id, host, pid, version, tags, status, started_at, last_heartbeat,
  heartbeat_age_seconds, running_runs, clock_offset_ms, claims_won, claims_lost, skipped``;
- ``leader``: ``holder, since, fence, expires_at`` while a node holds the lease, else null;
- ``jobs``: ``name, callable, source, schedule {kind, cron, timezone, interval_seconds},
  description, enabled, paused, paused_until, pause_reason, next_fire_time, last_run,
  last_success, last_failure`` (each run: ``id, key, state, scheduled_at, started_at,
  finished_at, node, error``), and ``problems``: why no node can use the stored definition, one
  message per problem (an orphaned callable, a value the validator refuses), empty when none;
- ``recent_failures``: the latest failed, timed out, lost and dead-lettered runs, newest first,
  each a run as above plus ``job``;
- ``unreadable``: the stored rows the report left out because a value in them cannot be read
  (see :mod:`django_cluster_jobs.stored`): ``table, id, problems`` each, and ``message``, what
  to do about it; empty when none.

``backlog()`` and ``dead_letters()`` are the cluster-wide figures the leader's metrics serve.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.db.models import Count, Min, Model

from .conf import app_settings
from .coordination import get_vendor
from .models import JobDefinition, JobRun, Lease, NodeStatus, RunState, WorkerNode
from .stored import UNREADABLE, collecting, tolerant
from .validation import known_names, stored_problems
from .wording import REPORT_LANGUAGE, describe_schedule

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    class _LastRunIds(TypedDict):
        last_run_id: int | None
        last_success_id: int | None
        last_failure_id: int | None

    #: A job definition as :func:`_jobs` annotates it.
    LastRunIds = WithAnnotations[JobDefinition, _LastRunIds]

RUN_FIELDS = ("pk", "key", "state", "scheduled_at", "started_at", "finished_at", "node", "error")


def iso(at: datetime | None) -> str | None:
    """Return ``at`` as ISO-8601 in UTC with a Z, to the millisecond; None stays None."""
    if at is None:
        return None
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build_status(
    *, using: str | None = None, failures: int = 10, now: datetime | None = None
) -> dict[str, Any]:
    """Return the status report (see the module docstring for its keys)."""
    alias = using or app_settings.DATABASE
    now = now or get_vendor(alias).db_now()
    dead_after = app_settings.DEAD_AFTER
    with collecting() as unreadable:
        nodes = _nodes(alias, now)
        report = {
            "generated_at": iso(now),
            "healthy": any(
                n["status"] == NodeStatus.ACTIVE and n["heartbeat_age_seconds"] <= dead_after
                for n in nodes
            ),
            "dead_after_seconds": dead_after,
            "nodes": nodes,
            "leader": _leader(alias, now),
            "jobs": _jobs(alias, now),
            "recent_failures": _failures(alias, failures),
        }
    report["unreadable"] = [
        {"table": row.table, "id": row.pk, "problems": list(row.problems), "message": str(row)}
        for row in unreadable
    ]
    return report


def _nodes(alias: str, now: datetime) -> list[dict[str, Any]]:
    running = dict(
        JobRun.objects.using(alias)
        .filter(state=RunState.RUNNING)
        .values_list("node")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return [
        {
            "node_id": node.node_id,
            "host": node.host,
            "pid": node.pid,
            "version": node.version,
            "tags": node.tags if isinstance(node.tags, list) else [],  # as stored, if a list
            "status": node.status,
            "started_at": iso(node.started_at),
            "last_heartbeat": iso(node.last_heartbeat),
            "heartbeat_age_seconds": round((now - node.last_heartbeat).total_seconds(), 3),
            "running_runs": running.get(node.node_id, 0),
            "clock_offset_ms": round(node.clock_offset_ms, 3),
            "claims_won": node.claims_won,
            "claims_lost": node.claims_lost,
            "skipped": node.skipped if isinstance(node.skipped, dict) else {},
        }
        for node in tolerant(WorkerNode.objects.using(alias).order_by("node_id"))
    ]


def _leader(alias: str, now: datetime) -> dict[str, Any] | None:
    lease = tolerant(Lease.objects.using(alias).leader(now)).first()
    if lease is None:
        return None
    return {
        "holder": lease.holder,
        "since": iso(lease.acquired_at),
        "fence": lease.fence,
        "expires_at": iso(lease.expires_at),
    }


def _run(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["pk"],
        "key": row["key"],
        "state": row["state"],
        "scheduled_at": iso(row["scheduled_at"]),
        "started_at": iso(row["started_at"]),
        "finished_at": iso(row["finished_at"]),
        "node": row["node"],
        "error": (row["error"] or "").split("\n", 1)[0],
    }


def _jobs(alias: str, now: datetime) -> list[dict[str, Any]]:
    runs = JobRun.objects.using(alias)
    definitions = list(
        tolerant(JobDefinition.objects.using(alias).with_last_runs(now).order_by("name"))
    )
    ids = {
        pk
        for d in definitions
        for pk in (d.last_run_id, d.last_success_id, d.last_failure_id)
        if pk is not None
    }
    by_id = {row["pk"]: _run(row) for row in tolerant(runs.filter(pk__in=ids).values(*RUN_FIELDS))}
    known = known_names(alias)
    return [_job(d, now, by_id, known) for d in definitions]


def _job(
    job: LastRunIds, now: datetime, runs: Mapping[int | None, Any], known: set[str]
) -> dict[str, Any]:
    paused = job.is_paused_at(now)
    return {
        "name": job.name,
        "callable": job.callable_name,
        "source": job.source,
        "schedule": {
            "kind": job.schedule_kind,
            "cron": job.cron or None,
            "timezone": job.timezone,
            "interval_seconds": job.interval.total_seconds() if job.interval else None,
        },
        "description": describe_schedule(job, REPORT_LANGUAGE),
        "enabled": job.enabled,
        "paused": paused,
        "paused_until": iso(job.paused_until) if paused else None,
        "pause_reason": job.pause_reason if paused else "",
        "next_fire_time": iso(next(iter(job.fire_times(now, 1)), None)),
        "last_run": runs.get(job.last_run_id),
        "last_success": runs.get(job.last_success_id),
        "last_failure": runs.get(job.last_failure_id),
        "problems": [str(problem) for problem in stored_problems(job, known)],
    }


def _failures(alias: str, limit: int) -> list[dict[str, Any]]:
    # Latest end first, runs without an end last: two reads, so an index serves each.
    failures = JobRun.objects.using(alias).failures().values(*RUN_FIELDS, "job__name")
    ended = failures.filter(finished_at__isnull=False).order_by("-finished_at", "-pk")
    rows = list(tolerant(ended[:limit]))
    if len(rows) < limit:
        rows += tolerant(failures.filter(finished_at__isnull=True).order_by("-pk"))[
            : limit - len(rows)
        ]
    return [{"job": row["job__name"], **_run(row)} for row in rows]


def backlog(alias: str, now: datetime) -> dict[str, tuple[int, float]]:
    """Pending runs due at ``now`` by queue: (how many, seconds the oldest has waited)."""
    due = JobRun.objects.using(alias).due(now)
    rows = due.values_list("job__queue").annotate(n=Count("pk"), oldest=Min("due_at")).order_by()
    try:
        return {queue: (n, max(0.0, (now - oldest).total_seconds())) for queue, n, oldest in rows}
    except UNREADABLE:  # a due time no converter reads: each queue's oldest of those that read
        counts = dict(due.values_list("job__queue").annotate(n=Count("pk")).order_by())
        found = {}
        for queue, n in counts.items():
            queued = due.filter(job__queue=queue).order_by("due_at")
            dues = tolerant(queued.values_list("pk", "due_at"))
            oldest = next((at for _, at in dues[:100] if isinstance(at, datetime)), now)
            found[queue] = (n, max(0.0, (now - oldest).total_seconds()))
        return found


def dead_letters(alias: str) -> dict[str, int]:
    """Dead-lettered runs kept in the ledger, by job name."""
    # By job id from the dead letters' own index alone (COUNT(*) reads no other column), then
    # named: a join here lets the planner read the dead letters once per job.
    rows = (
        JobRun.objects.using(alias)
        .filter(state=RunState.DEAD)
        .values_list("job_id")
        .annotate(n=Count("*"))
        .order_by()
    )
    counts = dict(rows)
    names = JobDefinition.objects.using(alias).filter(pk__in=counts).values_list("pk", "name")
    return {name: counts[pk] for pk, name in names}


def estimated_rows(alias: str, model: type[Model]) -> int | None:
    """The database's estimate of the rows of ``model``'s table, where it keeps one (PostgreSQL),
    else None: what a long list of the whole ledger shows instead of counting it."""
    return get_vendor(alias).estimated_rows(model._meta.db_table)

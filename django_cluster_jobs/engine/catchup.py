"""Misfire handling: occurrences no node fired, found and settled by the leader.

A node claims an occurrence only while it is at most ``MISFIRE_GRACE`` (5 s) late, so one that no
node fired in time (all were down, busy, draining or cut off from the database) has no row. At each
chore pass the leader finds those occurrences and settles each one once, by the job's policy:

- Jobs: enabled, unpaused cron and fixed-rate jobs placed once in the cluster, whatever node tags
  they require (the leader settles jobs it does not run itself; a tagged node runs the catch-up).
  Fixed-delay, startup and on-demand jobs have no fixed instants and ``every_node`` jobs run per
  node: none is caught up. Occurrences that fall while a job is disabled or paused are
  not misfires: the leader moves past them (a leader elected during the pause cannot tell).
- Up to: ``now - MISFIRE_GRACE - HEARTBEAT_INTERVAL``, after which no node still claims anything;
  or up to the start of the earliest live node when that is later, since a node only fires what
  falls after its own start: a cluster back from an outage is settled in one pass.
- From: how far this leader checked the job; a leader that has not checked it yet starts at the
  job's latest scheduled row (won, external, catch-up or missed; any state) older than a look-back
  of about a minute, else its latest such row, else the definition's ``created_at``. So whichever
  node leads first after an outage of the whole cluster notices it.
- At most ``SCAN_LIMIT`` occurrences per job per pass are examined, the most recent; a warning
  says when older ones were not. Examined occurrences without a row are missed.
- ``catch_up_window`` (Kubernetes' ``startingDeadlineSeconds``): an occurrence older than
  ``now - catch_up_window`` never runs; ``None`` sets no bound.
- An occurrence due at or before the job's latest catch-up was queued belongs to a gap already
  settled (the tail of an outage, seen one pass later): it never runs.
- ``fire_once`` (default): the most recent missed occurrence that may still run becomes one pending
  run, outcome ``catch_up``, due now, keyed by its own occurrence. A job that allows no overlap
  gives it its lane: if a run of the job is live, the occurrence is recorded ``skipped`` instead.
- ``skip``: none runs.
- ``run_all``: the most recent ``catch_up_limit`` that may still run become pending catch-up runs,
  without a lane (several may wait); they are taken in due order.
- Every other missed occurrence gets a row with state and outcome ``missed``, the leader as node
  and a reason saying why it did not run: at most ``misfire.MISSED_ROWS_LIMIT`` per job per pass,
  the most recent; a warning counts the rest. Each pass that settles anything adds one ``caught_up``
  cluster event.

Every row goes through the claim gate, inserted with the occurrence's own (job, key), a conflict
ignored: a node that fired late or a second leader never doubles an occurrence, and any number of
writers leave one row per missed occurrence.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import Max, Min, Q

from .. import signals
from ..conf import app_settings
from ..coordination.base import enabled_job_ids
from ..models import (
    ClusterEvent,
    ClusterEventKind,
    JobDefinition,
    JobRun,
    Misfire,
    NodeStatus,
    Outcome,
    Placement,
    RunState,
    WorkerNode,
)
from ..schedules import occurrence_key
from . import misfire
from .firing import MISFIRE_GRACE
from .planner import Planned

if TYPE_CHECKING:
    from .node import Node

logger = logging.getLogger(__name__)

#: Most occurrences of one job examined in one pass (the most recent ones).
SCAN_LIMIT = 10_000
#: Shortest look-back of a leader that has not checked a job yet.
MIN_LOOKBACK = timedelta(minutes=1)
#: Rows that stand for a scheduled occurrence (a fresh leader starts after the latest).
SCHEDULED = (Outcome.WON, Outcome.EXTERNAL, Outcome.CATCH_UP, Outcome.MISSED)
#: Longest detail of the cluster event that sums up one pass.
EVENT_DETAIL_LIMIT = 4_000
#: Jobs per ledger query (keeps SQLite under its parameter limit).
JOBS_PER_QUERY = 300
_INSTANT = timedelta(microseconds=1)

Rows = dict[tuple[int, str], tuple[str, str, datetime]]


@dataclass
class Progress:
    """How far one leader has checked each job: job id -> (its created_at, checked until)."""

    fence: int | None
    checked: dict[int, tuple[datetime, datetime]] = field(default_factory=dict)


#: Per node id; reset whenever the node's leader fence changes (a new term of leadership).
_progress: dict[str, Progress] = {}


@dataclass
class Scan:
    """The occurrences of one job examined in one pass, oldest first."""

    planned: Planned
    occurrences: list[datetime]
    truncated: bool = False

    @property
    def job_id(self) -> int:
        return self.planned.definition.pk


def catch_up(node: Node, now: datetime) -> int:
    """Settle missed occurrences by each job's misfire policy; return the rows written."""
    alias = node.coordinator.alias
    progress = progress_of(node)
    with transaction.atomic(using=alias):
        jobs, idle = _split(node.cluster_jobs.values(), alias, now)
        if not jobs and not idle:
            return 0
        until = settled_until(alias, now)
        since = _since(alias, jobs, progress, now)
        scans = [s for p in jobs if (s := scan(p, since[p.definition.pk], until)).occurrences]
        plans = _plans(alias, scans, now)
        written = _write(node, alias, plans, now)
        _record(node, alias, plans, written, now, progress.fence)
        _announce(node, alias, plans, written, now)
        checked = _checked(progress, idle, until)
        checked.update(_checked(progress, jobs, until, since))
        # Remembered only once written: a pass that rolls back is done again by the next one.
        transaction.on_commit(lambda: progress.checked.update(checked), using=alias)
    _warn_truncated(node, scans)
    return len(written)


def progress_of(node: Node) -> Progress:
    """Return what this node checked during its current term of leadership."""
    held = getattr(getattr(node, "leader", None), "held", None)
    fence = held.fence if held is not None else None
    progress = _progress.get(node.node_id)
    if progress is None or progress.fence != fence:
        progress = _progress[node.node_id] = Progress(fence)
    return progress


def _checked(
    progress: Progress,
    jobs: list[Planned],
    until: datetime,
    since: dict[int, datetime] | None = None,
) -> dict[int, tuple[datetime, datetime]]:
    """Return how far these jobs are checked after this pass (never less than before)."""
    checked = {}
    for p in jobs:
        created, mark = p.definition.created_at, until
        old = progress.checked.get(p.definition.pk)
        if old is not None and old[0] == created:
            mark = max(mark, old[1])
        checked[p.definition.pk] = (created, max(mark, (since or {}).get(p.definition.pk, mark)))
    return checked


def _split(planned, alias: str, now: datetime) -> tuple[list[Planned], list[Planned]]:
    """Return the fixed-instant cluster jobs that may run now, and those disabled or paused."""
    slotted = sorted(
        (
            p
            for p in list(planned)
            if p.schedule.slotted and p.definition.placement == Placement.CLUSTER
        ),
        key=lambda p: p.definition.pk,
    )
    if not slotted:
        return [], []
    live = enabled_job_ids(alias, {p.definition.pk for p in slotted}, now)
    # Policies as stored now: the planned copy may be a heartbeat behind an operator's change.
    return (
        [replace(p, definition=live[p.definition.pk]) for p in slotted if p.definition.pk in live],
        [p for p in slotted if p.definition.pk not in live],
    )


def settled_until(alias: str, now: datetime) -> datetime:
    """Return the latest instant no node will still claim an occurrence at or before."""
    horizon = now - MISFIRE_GRACE - timedelta(seconds=app_settings.HEARTBEAT_INTERVAL)
    first_start = (
        WorkerNode.objects.using(alias)
        .filter(status__in=(NodeStatus.ACTIVE, NodeStatus.DRAINING))
        .aggregate(first=Min("started_at"))["first"]
    )
    # A node fires only occurrences after its own start, so none is left for anything earlier.
    return horizon if first_start is None else max(horizon, min(first_start, now))


def lookback() -> timedelta:
    """How far before its first pass a new leader re-checks jobs that have run since then."""
    term = timedelta(seconds=app_settings.LEADER_TTL + app_settings.HEARTBEAT_INTERVAL)
    retained = timedelta(days=app_settings.RETENTION_DAYS) / 2
    return min(max(MIN_LOOKBACK, 2 * term + MISFIRE_GRACE), retained)


def _since(
    alias: str, jobs: list[Planned], progress: Progress, now: datetime
) -> dict[int, datetime]:
    since, fresh = {}, []
    for p in jobs:
        mark = progress.checked.get(p.definition.pk)
        if mark is not None and mark[0] == p.definition.created_at:
            since[p.definition.pk] = mark[1]
        else:
            fresh.append(p.definition)
    if fresh:
        since.update(anchors(alias, fresh, now))
    return since


def anchors(alias: str, definitions: Sequence[JobDefinition], now: datetime) -> dict[int, datetime]:
    """Return where a leader that has not checked these jobs yet starts looking."""
    cutoff = now - lookback()
    rows = (
        JobRun.objects.using(alias)
        .filter(job_id__in=[d.pk for d in definitions], outcome__in=SCHEDULED)
        .values("job_id")
        .annotate(
            latest=Max("scheduled_at"),
            before=Max("scheduled_at", filter=Q(scheduled_at__lte=cutoff)),
        )
        .order_by()
    )
    found = {row["job_id"]: row["before"] or row["latest"] for row in rows}
    return {d.pk: found.get(d.pk) or d.created_at for d in definitions}


def scan(planned: Planned, since: datetime, until: datetime) -> Scan:
    """Return the occurrences in (since, until], the most recent ``SCAN_LIMIT`` of them."""
    schedule, found = planned.schedule, []
    at = schedule.previous_at_or_before(until)
    while at is not None and at > since:
        if len(found) == SCAN_LIMIT:
            return Scan(planned, found[::-1], truncated=True)
        found.append(at)
        at = schedule.previous_at_or_before(at - _INSTANT)
    return Scan(planned, found[::-1])


def existing(alias: str, spans: Sequence[tuple[int, datetime, datetime]]) -> Rows:
    """Return the rows of each (job id, first, last) span: (job id, key) -> state, outcome,
    created_at; one query per ``JOBS_PER_QUERY`` jobs."""
    found: Rows = {}
    for start in range(0, len(spans), JOBS_PER_QUERY):
        where = Q()
        for job_id, first, last in spans[start : start + JOBS_PER_QUERY]:
            where |= Q(job_id=job_id, scheduled_at__gte=first, scheduled_at__lte=last)
        rows = JobRun.objects.using(alias).filter(where).order_by()
        for job_id, key, *rest in rows.values_list(
            "job_id", "key", "state", "outcome", "created_at"
        ):
            found[(job_id, key)] = tuple(rest)  # type: ignore[assignment]
    return found


def _plans(alias: str, scans: list[Scan], now: datetime) -> list[misfire.Plan]:
    present = existing(alias, [(s.job_id, s.occurrences[0], s.occurrences[-1]) for s in scans])
    missing = {
        s.job_id: [at for at in s.occurrences if (s.job_id, occurrence_key(at)) not in present]
        for s in scans
    }
    runnable = [
        s.job_id
        for s in scans
        if missing[s.job_id] and s.planned.definition.misfire != Misfire.SKIP
    ]
    queued = _last_catch_up(alias, runnable)
    return [
        misfire.decide(s.planned, missing[s.job_id], now, queued.get(s.job_id))
        for s in scans
        if missing[s.job_id]
    ]


def _last_catch_up(alias: str, job_ids: list[int]) -> dict[int, datetime]:
    """Return when each job's latest catch-up row was written."""
    if not job_ids:
        return {}
    rows = (
        JobRun.objects.using(alias)
        .filter(job_id__in=job_ids, outcome=Outcome.CATCH_UP)
        .values("job_id")
        .annotate(last=Max("created_at"))
        .order_by()
    )
    return {row["job_id"]: row["last"] for row in rows}


def _write(node: Node, alias: str, plans: list[misfire.Plan], now: datetime) -> list[JobRun]:
    """Insert through the claim gate; return the rows this pass wrote."""
    rows = [row for plan in plans for row in misfire.rows_of(plan, now, node.node_id)]
    if not rows:
        return []
    JobRun.objects.using(alias).bulk_create(rows, ignore_conflicts=True)
    spans: dict[int, tuple[datetime, datetime]] = {}
    for row in rows:  # in time order per job
        spans[row.job_id] = (spans.get(row.job_id, (row.scheduled_at,))[0], row.scheduled_at)
    after = existing(alias, [(job_id, *span) for job_id, span in spans.items()])
    written = [r for r in rows if after.get((r.job_id, r.key)) == (r.state, r.outcome, now)]
    # A catch-up run that left no row at all lost to a live run holding the job's lane.
    blocked = [misfire.overlapped(r, node.node_id) for r in rows if (r.job_id, r.key) not in after]
    if blocked:
        JobRun.objects.using(alias).bulk_create(blocked, ignore_conflicts=True)
    if any(r.state == RunState.PENDING for r in written):
        transaction.on_commit(node.coordinator.notify_pending, using=alias)
    return written + blocked


def _record(
    node: Node, alias: str, plans: list[misfire.Plan], written: list[JobRun], now: datetime, fence
) -> None:
    """Log what each job's settlement did and add one cluster event for the whole pass."""
    counts = Counter((row.job_id, row.state) for row in written)
    lines = []
    for plan in plans:
        name, job_id = plan.planned.name, plan.planned.definition.pk
        queued, missed, skipped = (
            counts[(job_id, state)]
            for state in (RunState.PENDING, RunState.MISSED, RunState.SKIPPED)
        )
        if not (queued or missed or skipped or plan.dropped):
            continue
        line = (
            f"{name}: {queued} catch-up run(s) queued, {missed} recorded missed, {skipped} skipped"
        )
        logger.info("%s", line, extra={"node": node.node_id, "job": name})
        if plan.dropped:
            logger.warning(
                "%s: %d more missed occurrence(s) not recorded (at most %d rows per pass)",
                name,
                plan.dropped,
                misfire.MISSED_ROWS_LIMIT,
                extra={"node": node.node_id, "job": name},
            )
            line += f", {plan.dropped} more missed and not recorded"
        lines.append(line)
    if lines:
        ClusterEvent.objects.using(alias).create(
            at=now,
            kind=ClusterEventKind.CAUGHT_UP,
            node=node.node_id,
            fence=fence,
            detail="; ".join(lines)[:EVENT_DETAIL_LIMIT],
        )


def _announce(
    node: Node, alias: str, plans: list[misfire.Plan], written: list[JobRun], now: datetime
) -> None:
    """Send ``run_missed`` and ``run_skipped`` for the rows this pass wrote, once committed.

    Only rows that name this leader and this pass's time are its own, so a leader racing another
    never announces the other's rows."""
    settled = [r for r in written if r.state in (RunState.MISSED, RunState.SKIPPED)]
    if not settled:
        return
    names = {plan.planned.definition.pk: plan.planned.name for plan in plans}
    ours = {
        (job_id, key): pk
        for job_id, key, pk in JobRun.objects.using(alias)
        .filter(job_id__in={r.job_id for r in settled}, key__in={r.key for r in settled})
        .filter(node=node.node_id, created_at=now)
        .values_list("job_id", "key", "pk")
    }

    def send() -> None:
        for row in settled:
            if (row.job_id, row.key) not in ours:
                continue
            signal = signals.run_missed if row.state == RunState.MISSED else signals.run_skipped
            signals.send(
                signal,
                names[row.job_id],
                run_id=ours[(row.job_id, row.key)],
                key=row.key,
                node=node.node_id,
                attempt=0,
                reason=row.reason,
            )

    transaction.on_commit(send, using=alias)


def _warn_truncated(node: Node, scans: list[Scan]) -> None:
    for s in scans:
        if s.truncated:
            logger.warning(
                "%s: more than %d occurrences to check; only the latest %d (from %s) were",
                s.planned.name,
                SCAN_LIMIT,
                SCAN_LIMIT,
                occurrence_key(s.occurrences[0]),
                extra={"node": node.node_id, "job": s.planned.name},
            )

"""Settling: deciding every occurrence of a job that no node claimed, up to an instant, once.

Each job definition carries ``settled_through``, a mark in cluster time with one invariant: every
occurrence at or before it is decided — claimed by a node (run, skipped, lost…), recorded missed by
the misfire policy, or intentionally not due (before the job existed or last changed, while it
was paused or disabled). Node claims refuse occurrences at or before the mark in the statement
that claims, so a decision never depends on ledger rows that retention may delete.

``settle(definitions, until)`` moves each mark to ``until``, deciding on the way the occurrences in
(mark, until] that have no row: the job's misfire policy turns them into pending catch-up runs or
missed rows, written through the claim gate (the unique (job, key); a catch-up that would overlap a
live run of a no-overlap job is recorded skipped). Two callers, each holding the definitions'
row locks so the two never settle one job at once:

- the leader's catch-up, fenced by its lease, up to ``now - grace``, after which no node claims;
- a definition change (create, schedule edit, pause, resume, enable, disable, breaker), up to
  the change's own time, under the definition as stored before it.

Fixed-instant jobs placed once in the cluster (cron, fixed rate) are settled; others have no
occurrences a node could miss (fixed delay, startup, on demand, every node), so their marks move
with nothing to decide. Occurrences at or after a paused job's ``paused_until`` are due; earlier
ones are not. The cost of a pass is O(jobs + new occurrences), never O(history).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Case, DateTimeField, Q, Value, When

from ..coordination import get_vendor
from ..exceptions import ClusterJobsError
from ..models import (
    LIVE_STATES,
    EventKind,
    JobDefinition,
    JobRun,
    Misfire,
    Outcome,
    Placement,
    RunEvent,
    RunState,
)
from ..policies.misfire import Plan, Policy, decide
from ..policies.overlap import takes_lane
from ..schedules import occurrence_key

logger = logging.getLogger(__name__)

#: Most occurrences of one job examined in one pass (the most recent); older ones are reported.
SCAN_LIMIT = 10_000
#: Jobs per ledger query (keeps SQLite under its parameter limit).
JOBS_PER_QUERY = 300
#: Why an occurrence was not claimed, when the leader settles it.
NOT_FIRED = "no node fired it in time"
#: ``next_to_settle`` of a job with nothing to settle.
NEVER = datetime(9999, 12, 31, tzinfo=UTC)
_INSTANT = timedelta(microseconds=1)


@dataclass
class Span:
    """The due occurrences of one job in (mark, until], oldest first."""

    definition: JobDefinition
    occurrences: list[datetime] = field(default_factory=list)
    truncated: bool = False
    error: str = ""

    @property
    def job_id(self) -> int:
        return self.definition.pk


@dataclass
class Settled:
    """What settling one job did: its plan and the rows this call wrote."""

    definition: JobDefinition
    plan: Plan
    written: list[JobRun]
    #: The oldest occurrence examined when older ones were settled without being examined.
    truncated_at: datetime | None = None


def next_to_settle(definition: JobDefinition, mark: datetime | None) -> datetime | None:
    """Return the first occurrence after ``mark`` that settling the job may have to decide:
    :data:`NEVER` when it has none (not due: disabled, not placed once in the cluster, not a
    fixed-instant schedule, paused until resumed), None when it cannot be computed (the
    leader then looks at the job at every pass)."""
    if not definition.enabled or definition.placement != Placement.CLUSTER:
        return NEVER
    if mark is None:
        return None
    paused = definition.paused_until
    start = mark if paused is None else max(mark, paused - _INSTANT)
    try:
        schedule = definition.get_schedule()
        if not schedule.slotted or start >= NEVER - _INSTANT:
            return NEVER
        following = schedule.next_after(start)
    except OverflowError:  # past the end of the calendar
        return NEVER
    except (ClusterJobsError, ValueError, TypeError):
        return None
    return NEVER if following is None else min(following, NEVER)


def due_start(definition: JobDefinition, until: datetime) -> datetime | None:
    """Return the instant after which the job's occurrences up to ``until`` are due, or None."""
    if not definition.enabled or definition.placement != Placement.CLUSTER:
        return None
    start, paused = definition.settled_through, definition.paused_until
    if paused is not None:
        if paused > until:
            return None
        start = max(start, paused - _INSTANT)
    return start if start < until else None


def span_of(definition: JobDefinition, until: datetime) -> Span:
    """Return the job's due occurrences in (mark, until], the most recent SCAN_LIMIT of them."""
    try:
        start = due_start(definition, until)
        schedule = definition.get_schedule()
        if start is None or not schedule.slotted:
            return Span(definition)
        found: list[datetime] = []
        at = schedule.previous_at_or_before(until)
        while at is not None and at > start:
            if len(found) == SCAN_LIMIT:
                return Span(definition, found[::-1], truncated=True)
            found.append(at)
            at = schedule.previous_at_or_before(at - _INSTANT)
    except (ClusterJobsError, ValueError, TypeError, OverflowError) as exc:
        return Span(definition, error=f"{type(exc).__name__}: {exc}")
    return Span(definition, found[::-1])


def settle(
    alias: str,
    definitions: Sequence[JobDefinition],
    until: datetime,
    now: datetime,
    *,
    decider: str = "",
    cause: str = NOT_FIRED,
    record_only: bool = False,
) -> list[Settled]:
    """Decide the unclaimed occurrences of each job in (mark, until] and move its mark there.

    With ``record_only`` (a pause or a disable) none runs: each is recorded missed. Call inside
    a transaction holding the definitions' row locks. A job whose schedule cannot be computed
    keeps its mark and is logged (it is invalid until fixed); every other job settles.
    """
    spans = [span_of(d, until) for d in definitions]
    for span in spans:
        if span.error:
            logger.error("%s: cannot settle its occurrences: %s", span.definition.name, span.error,
                         extra={"job": span.definition.name})  # fmt: skip
    busy = [s for s in spans if s.occurrences]
    present = _present(alias, [(s.job_id, s.occurrences[0]) for s in busy], now)
    catching_up = _catching_up(alias, [s.job_id for s in busy])
    settled = []
    for span in busy:
        keys = present.get(span.job_id, set())
        missing = [at for at in span.occurrences if occurrence_key(at) not in keys]
        policy = Policy.of(span.definition)
        if record_only:
            policy = replace(policy, misfire=Misfire.SKIP)
        plan = decide(policy, missing, now, catching_up=catching_up.get(span.job_id))
        cut = span.occurrences[0] if span.truncated else None
        settled.append(Settled(span.definition, plan, [], cut))
    _write(alias, [s for s in settled if s.plan.runs or s.plan.missed], now, decider, cause)
    advance(alias, [s.definition for s in spans if not s.error], until)
    return settled


def _present(alias: str, spans: list[tuple[int, datetime]], now: datetime) -> dict[int, set[str]]:
    """Return, per job, the keys of its rows scheduled from ``first`` to ``now``."""
    found: dict[int, set[str]] = {}
    for start in range(0, len(spans), JOBS_PER_QUERY):
        where = Q()
        for job_id, first in spans[start : start + JOBS_PER_QUERY]:
            where |= Q(job_id=job_id, scheduled_at__gte=first, scheduled_at__lte=now)
        rows = JobRun.objects.using(alias).filter(where).order_by()
        for job_id, key in rows.values_list("job_id", "key"):
            found.setdefault(job_id, set()).add(key)
    return found


def _catching_up(alias: str, job_ids: list[int]) -> dict[int, str]:
    """Return the key of a live (pending or running) catch-up run of each job that has one."""
    if not job_ids:
        return {}
    live = JobRun.objects.using(alias).filter(
        job_id__in=job_ids, outcome=Outcome.CATCH_UP, state__in=LIVE_STATES
    )
    return dict(live.values_list("job_id", "key"))


def _write(alias: str, settled: list[Settled], now: datetime, decider: str, cause: str) -> None:
    """Insert the rows of each plan through the claim gate; record which ones this call wrote."""
    rows = [row for s in settled for row in rows_of(s.definition, s.plan, now, cause)]
    if not rows:
        return
    JobRun.objects.using(alias).bulk_create(rows, ignore_conflicts=True)
    after = _rows_at(alias, rows)
    mine = [r for r in rows if after.get((r.job_id, r.key), (None,))[1:] == (r.state, now)]
    # A catch-up run that left no row at all lost to a live run holding the job's lane.
    blocked = [overlapped(r) for r in rows if (r.job_id, r.key) not in after]
    if blocked:
        JobRun.objects.using(alias).bulk_create(blocked, ignore_conflicts=True)
        after.update(_rows_at(alias, blocked))
        mine += [r for r in blocked if after.get((r.job_id, r.key), (None,))[1:] == (r.state, now)]
    for row in mine:
        row.pk = after[(row.job_id, row.key)][0]
    by_job: dict[int, Settled] = {s.definition.pk: s for s in settled}
    for row in mine:
        by_job[row.job_id].written.append(row)
    _events(alias, mine, now, decider)
    if any(r.state == RunState.PENDING for r in mine):
        transaction.on_commit(get_vendor(alias).notify_pending, using=alias)


Stored = dict[tuple[int, str], tuple[int, str, datetime]]


def _rows_at(alias: str, rows: Iterable[JobRun]) -> Stored:
    """Return (job id, key) -> (pk, state, created_at) of the stored rows with these keys."""
    keys: dict[int, set[str]] = {}
    for row in rows:
        keys.setdefault(row.job_id, set()).add(row.key)
    found: Stored = {}
    for job_id, job_keys in keys.items():
        stored = JobRun.objects.using(alias).filter(job_id=job_id, key__in=job_keys)
        for pk, key, state, created in stored.values_list("pk", "key", "state", "created_at"):
            found[(job_id, key)] = (pk, state, created)
    return found


def _events(alias: str, rows: list[JobRun], now: datetime, decider: str) -> None:
    """One timeline entry per missed or skipped row, naming who decided it."""
    kinds: dict[str, EventKind] = {
        RunState.MISSED: EventKind.MISSED,
        RunState.SKIPPED: EventKind.SKIPPED,
    }
    RunEvent.objects.using(alias).bulk_create(
        RunEvent(run_id=r.pk, at=now, kind=kinds[r.state], node=decider, reason=r.reason)
        for r in rows
        if r.state in kinds
    )


def advance(alias: str, definitions: Sequence[JobDefinition], until: datetime) -> None:
    """Move these jobs' marks forward to ``until`` (never back: a change may have moved one
    further meanwhile), and their ``next_to_settle`` to the first occurrence after it; one
    statement per :data:`JOBS_PER_QUERY` jobs."""
    for start in range(0, len(definitions), JOBS_PER_QUERY):
        chunk = definitions[start : start + JOBS_PER_QUERY]
        nexts = {d.pk: next_to_settle(d, until) for d in chunk}
        JobDefinition.objects.using(alias).filter(
            pk__in=list(nexts), settled_through__lt=until
        ).update(settled_through=until, next_to_settle=_per_job(nexts))


def _per_job(values: dict[int, datetime | None]) -> Case | datetime | None:
    """One value for every job in ``values`` (by id), as an UPDATE sets it."""
    distinct = set(values.values())
    if len(distinct) == 1:
        return distinct.pop()
    whens = [When(pk=pk, then=Value(at, output_field=DateTimeField())) for pk, at in values.items()]
    return Case(*whens, output_field=DateTimeField())


def rows_of(definition: JobDefinition, plan: Plan, now: datetime, cause: str) -> list[JobRun]:
    """The rows of ``plan``, in time order: missed ones and pending catch-up runs."""
    lane = None
    if definition.misfire == Misfire.FIRE_ONCE and takes_lane(definition, Outcome.CATCH_UP):
        lane = definition.pk
    rows = [_row(definition, at, now, f"{cause}; {why}") for at, why in plan.missed]
    for at in plan.runs:
        reason = f"catch-up ({definition.misfire}): {cause}"
        rows.append(_row(definition, at, now, reason, state=RunState.PENDING, lane=lane))
    return sorted(rows, key=lambda row: row.scheduled_at)


def _row(definition: JobDefinition, at: datetime, now: datetime, reason: str, **fields) -> JobRun:
    """A missed row (it belongs to no node), or with ``state=PENDING`` a catch-up run due now."""
    pending = fields.get("state") == RunState.PENDING
    if not pending:
        fields.update(state=RunState.MISSED, fence=0, finished_at=now)
    row = JobRun(
        job_id=definition.pk,
        key=occurrence_key(at),
        scheduled_at=at,
        due_at=now if pending else at,
        outcome=Outcome.CATCH_UP if pending else Outcome.MISSED,
        created_at=now,
        node="",
        reason=reason[:200],
        payload=definition.default_payload(),
        priority=definition.priority,
        **fields,
    )
    if pending:
        row.set_rank()  # stored with the row: bulk_create calls no save()
    return row


def overlapped(row: JobRun) -> JobRun:
    """Turn a catch-up run refused by a live run of its job into a skipped row."""
    row.state, row.lane, row.fence, row.finished_at = RunState.SKIPPED, None, 0, row.created_at
    row.reason = "catch-up skipped: a run of this job is still pending or running (overlap skip)"
    return row

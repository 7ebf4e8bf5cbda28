"""The portable vendor: plain ORM on any database Django supports; the reference the fast paths
must agree with (the contract tests run against both)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import ClassVar

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Case, DateTimeField, F, Min, Q, QuerySet, Value, When
from django.db.models.functions import Now

from ..bounds import EARLIEST_RUN_AT, LATEST_RUN_AT
from ..models import (
    DEFINITIONS,
    LEADER_LEASE,
    LIVE_NODE,
    Counter,
    EventKind,
    JobDefinition,
    JobRun,
    Lease,
    RunEvent,
    RunState,
    WorkerNode,
)
from ..policies.overlap import takes_lane
from ..stored import UNREADABLE
from .base import Features, Vendor, is_lock_timeout, lease_row
from .pending import pick, taken_kind, won_of
from .types import Claim, Heartbeat, LeaderRenewal, LeaseSeen, NodeStats, Peer, Won


def earliest_expiry(runs: QuerySet) -> datetime | None:
    """The earliest lease expiry of ``runs`` within the instants Python holds, never an error:
    on PostgreSQL a lease at -infinity or infinity reads as the nearest end (in SQL: MariaDB
    would answer such a CASE as text); elsewhere a value no converter reads (text that is no
    date on SQLite) makes the earliest expiry due at once."""
    if connections[runs.db].vendor == "postgresql":
        within = Case(
            When(lease_expires_at__lt=EARLIEST_RUN_AT, then=Value(EARLIEST_RUN_AT)),
            When(lease_expires_at__gt=LATEST_RUN_AT, then=Value(LATEST_RUN_AT)),
            default=F("lease_expires_at"),
            output_field=DateTimeField(),
        )
        return runs.aggregate(at=Min(within))["at"]
    try:
        return runs.aggregate(at=Min("lease_expires_at"))["at"]
    except UNREADABLE:
        return EARLIEST_RUN_AT

class ORMVendor(Vendor):
    """One ``get_or_create`` per claim, compare-and-set updates, locks by ``select_for_update``
    where the database has them and a no-op write (its write lock) where it does not."""

    name = "orm"
    features: ClassVar[Features] = Features()

    @property
    def row_locks(self) -> bool:
        return bool(self.connection.features.has_select_for_update)

    # -- claims -------------------------------------------------------------------------------

    def claim(
        self, claims: Sequence[Claim], node: str, now: datetime, lease_until: datetime
    ) -> list[Won]:
        allowed = open_jobs(self.alias, {c.job_id for c in claims}, now)
        results = (
            self._claim_one(c, node, now, lease_until, takes_lane(allowed[c.job_id], c.outcome))
            for c in claims
            if c.job_id in allowed and not slot_refused(allowed[c.job_id], c)
        )
        return [won for won in results if won is not None]

    def _claim_one(
        self, claim: Claim, node: str, now: datetime, lease_until: datetime, laned: bool
    ) -> Won | None:
        defaults = {
            "scheduled_at": claim.scheduled_at,
            "due_at": claim.scheduled_at,
            "state": RunState.RUNNING,
            "outcome": claim.outcome,
            "node": node,
            "lease_expires_at": lease_until,
            "priority": claim.priority,
            "payload": claim.payload,
            "created_at": now,
            "started_at": now,
            "lane": claim.job_id if laned else None,
        }
        try:
            with transaction.atomic(using=self.alias):
                run, created = JobRun.objects.using(self.alias).get_or_create(
                    job_id=claim.job_id, key=claim.key, defaults=defaults
                )
                if created:
                    RunEvent.objects.using(self.alias).create(
                        run=run, kind=EventKind.CLAIMED, node=node, fence=run.fence, at=now
                    )
        except IntegrityError:  # the job's lane is taken: a run of it is still live (overlap)
            return None
        except DatabaseError as exc:
            if is_lock_timeout(exc):
                return None
            raise
        return Won(run.pk, claim.job_id, claim.key, run.fence, run.attempt) if created else None

    # -- heartbeats ---------------------------------------------------------------------------

    def heartbeat(
        self,
        node: str,
        now: datetime,
        lease_until: datetime,
        stats: NodeStats,
        runs: Collection[tuple[int, int]] = (),
        leader: LeaderRenewal | None = None,
    ) -> Heartbeat:
        alias = self.alias
        with transaction.atomic(using=alias):
            nodes = WorkerNode.objects.using(alias).filter(node_id=node)
            nodes.update(last_heartbeat=now, **stats.fields())
            mine = JobRun.objects.using(alias).filter(
                owned_by(runs), node=node, state=RunState.RUNNING
            )
            mine.update(lease_expires_at=lease_until)
            owned = list(mine.values_list("pk", "cancel_requested"))
            status = nodes.values_list("status", flat=True).first()
            counters = Counter.objects.using(alias).filter(name=DEFINITIONS)
            definitions = counters.values_list("value", flat=True).first()
            leases = Lease.objects.using(alias).filter(name=LEADER_LEASE)
            seen = leases.values_list("holder", "expires_at").first()
            fence = None
            if leader is not None:
                mine_lease = leases.filter(token=leader.token, expires_at__gt=now)
                if mine_lease.update(expires_at=leader.until):
                    fence = mine_lease.values_list("fence", flat=True).first()
            live = WorkerNode.objects.using(alias).filter(status__in=LIVE_NODE).order_by("pk")
            peers = live.values_list("pk", "node_id", "process", "last_heartbeat")
            expiry = JobRun.objects.using(alias).filter(state=RunState.RUNNING)
            next_expiry = earliest_expiry(expiry)
        return Heartbeat.of(
            status,
            owned,
            definitions=definitions,
            peers=tuple(Peer(*row) for row in peers),
            leader_fence=fence,
            leader=LeaseSeen(*seen) if seen else None,
            next_expiry=next_expiry,
        )

    # -- pending runs -------------------------------------------------------------------------

    def take_pending(
        self, node: str, job_ids: Collection[int], limit: int, now: datetime, lease_until: datetime
    ) -> list[Won]:
        if not job_ids or limit < 1:
            return []
        skip = bool(self.connection.features.has_select_for_update_skip_locked)
        with transaction.atomic(using=self.alias):
            due = JobRun.objects.using(self.alias).due(now).filter(job_id__in=job_ids)
            taken = []
            for pk, fence, cause, reason in pick(due, limit, now, skip_locked=skip):
                if self._take(pk, fence, (cause, reason), node, now, lease_until):
                    taken.append(won_of(JobRun.objects.using(self.alias).get(pk=pk)))
        return taken

    def _take(
        self,
        pk: int,
        fence: int,
        why: tuple[str, str],
        node: str,
        now: datetime,
        lease_until: datetime,
    ) -> bool:
        updated = (
            JobRun.objects.using(self.alias)
            .filter(pk=pk, fence=fence, state=RunState.PENDING)
            .update(
                state=RunState.RUNNING,
                node=node,
                fence=fence + 1,
                lease_expires_at=lease_until,
                started_at=now,
            )
        )
        if updated:
            cause, reason = why
            RunEvent.objects.using(self.alias).create(
                run_id=pk, kind=taken_kind(cause), node=node, fence=fence + 1, reason=reason, at=now
            )
        return bool(updated)

    # -- locks and the clock ------------------------------------------------------------------

    def lock_job(self, job_id: int) -> None:
        jobs = JobDefinition.objects.using(self.alias).filter(pk=job_id)
        if self.row_locks:
            list(jobs.select_for_update().values_list("pk"))
        else:  # SQLite and friends: a no-op write takes the database's write lock.
            jobs.update(enabled=F("enabled"))

    def lock_queue(self, queue: str) -> None:
        name = f"queue:{queue}"
        if not self._lock_row(lease_row(self.alias, name)):  # deleted meanwhile: lock a new one
            self._lock_row(lease_row(self.alias, name, recheck=True))

    def _lock_row(self, rows: QuerySet[Lease]) -> bool:
        if self.row_locks:
            return bool(list(rows.select_for_update().values_list("pk")))
        return bool(rows.update(fence=F("fence")))

    def db_now(self) -> datetime:
        conn, now = self.connection, Now()
        compiler = JobDefinition.objects.using(self.alias).query.get_compiler(self.alias)
        sql, params = compiler.compile(now)
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT {sql}{conn.features.bare_select_suffix}", params)
            value = cursor.fetchone()[0]
        for convert in conn.ops.get_db_converters(now) + now.get_db_converters(conn):
            value = convert(value, now, conn)
        return value


def open_jobs(alias: str, job_ids: set[int], now: datetime) -> dict[int, JobDefinition]:
    """Return the definitions among ``job_ids`` that are enabled and not paused at ``now``."""
    rows = (
        JobDefinition.objects.using(alias)
        .filter(pk__in=job_ids, enabled=True)
        .filter(Q(paused_until__isnull=True) | Q(paused_until__lte=now))
    )
    return {row.pk: row for row in rows}


def slot_refused(definition: JobDefinition, claim: Claim) -> bool:
    """True when ``claim`` is an occurrence the job's mark already settled, one planned from an
    older revision of the definition, or one that falls in a pause; mirrors sql.SETTLED."""
    if not claim.slot:
        return False
    paused = definition.paused_until is not None and claim.scheduled_at < definition.paused_until
    stale = claim.revision != definition.revision
    return paused or stale or claim.scheduled_at <= definition.settled_through


def owned_by(runs: Collection[tuple[int, int]]) -> Q:
    """Match exactly these (run id, fence) pairs; nothing when there are none."""
    match = Q(pk__in=[])
    for run_id, fence in runs:
        match |= Q(pk=run_id, fence=fence)
    return match

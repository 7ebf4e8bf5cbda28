"""The coordinator interface and the portable parts every dialect shares."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from ..models import EventKind, JobDefinition, JobRun, Lease, RunEvent, RunState, WorkerNode
from .ownership import OwnershipMixin
from .policies import PolicyMixin


@dataclass(frozen=True)
class Claim:
    """One occurrence this node wants to run."""

    job_id: int
    key: str
    scheduled_at: datetime
    outcome: str = "won"
    priority: int = 0
    payload: dict = field(default_factory=dict)
    #: True for an occurrence of the job's schedule (a slot): refused at or before the job's
    #: ``settled_through`` mark, in a pause, or when planned from another ``revision`` of the
    #: definition than the stored one. Startup, window and explicitly keyed external claims are not.
    slot: bool = False
    revision: int = 0


@dataclass(frozen=True)
class Won:
    """A claim this node won: the run row it now owns, under ``fence``."""

    run_id: int
    job_id: int
    key: str
    fence: int = 1
    attempt: int = 1
    scheduled_at: datetime | None = None
    payload: dict | None = None


@dataclass(frozen=True)
class WindowResult:
    """The answer to a fixed-delay window claim: the run won, or when to ask again."""

    won: Won | None = None
    next_check: datetime | None = None


@dataclass(frozen=True)
class NodeStats:
    """What a node reports at each heartbeat."""

    clock_offset_ms: float = 0.0
    claims_won: int = 0
    claims_lost: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        return {
            "clock_offset_ms": self.clock_offset_ms,
            "claims_won": self.claims_won,
            "claims_lost": self.claims_lost,
            "skipped": dict(self.skipped),
        }


@dataclass(frozen=True)
class Heartbeat:
    """What a heartbeat learned: the node's status as stored and the runs it still owns, and
    the database's clock when the statement could read it (PostgreSQL) at no extra cost."""

    status: str
    owned_runs: frozenset[int]
    cancel_requested: frozenset[int] = frozenset()
    db_time: datetime | None = None


def json_param(connection: Any, value: Any) -> Any:
    """Adapt a JSON value for a raw query on this connection."""
    return connection.ops.adapt_json_value(value, None)


def dt_param(connection: Any, value: datetime | None) -> Any:
    """Adapt an aware datetime for a raw query on this connection."""
    return connection.ops.adapt_datetimefield_value(value)


def window_decision(
    latest: tuple[str, datetime | None] | None,
    now: datetime,
    interval: timedelta,
    recheck: timedelta,
) -> datetime | None:
    """Return None when a fixed-delay job is due now, else when to look again."""
    if latest is None:
        return None
    state, finished_at = latest
    if state in (RunState.PENDING, RunState.RUNNING) or finished_at is None:
        return now + min(interval, recheck)
    due = finished_at + interval
    return None if due <= now else due


class Coordinator(OwnershipMixin, PolicyMixin):
    """The operations the node loop needs from the database; subclasses speed up the hot ones."""

    vendor = "orm"
    #: True where idle nodes are woken by notifications instead of polling for pending runs.
    listens = False
    #: True where the database's clock is this host's own clock (SQLite runs in the process):
    #: a node's offset to it is then known exactly instead of estimated from a round trip.
    clock_is_local = False

    def __init__(self, alias: str) -> None:
        self.alias = alias

    @property
    def connection(self) -> Any:
        return connections[self.alias]

    # -- claims -------------------------------------------------------------------------------

    def claim(
        self, claims: Sequence[Claim], node: str, now: datetime, lease_until: datetime
    ) -> list[Won]:
        """Insert a run per claim unless one exists; return exactly the claims this node won."""
        raise NotImplementedError

    def claim_window(
        self,
        job_id: int,
        interval: timedelta,
        key: str,
        node: str,
        now: datetime,
        lease_until: datetime,
        recheck: timedelta,
    ) -> WindowResult:
        """Claim a fixed-delay run if no run of the job is live or finished within ``interval``."""
        with transaction.atomic(using=self.alias):
            self.lock_job(job_id)
            latest = self._latest(job_id)
            next_check = window_decision(latest, now, interval, recheck)
            if next_check is not None:
                return WindowResult(next_check=next_check)
            won = self.claim([Claim(job_id, key, now)], node, now, lease_until)
        return WindowResult(won=won[0] if won else None, next_check=None if won else now + recheck)

    def bound_lock_waits(self, seconds: float) -> None:
        """Make statements of the current transaction give up after waiting ``seconds`` for a
        row lock (PostgreSQL), instead of waiting for as long as its holder keeps it; elsewhere
        the database's own busy timeout applies."""

    def lock_job(self, job_id: int) -> None:
        """Serialise window claims of one job until the transaction ends."""
        jobs = JobDefinition.objects.using(self.alias).filter(pk=job_id)
        if self.connection.features.has_select_for_update:
            list(jobs.select_for_update().values_list("pk"))
        else:  # SQLite and friends: a no-op write takes the database's write lock.
            jobs.update(enabled=F("enabled"))

    def lock_queue(self, queue: str) -> None:
        """Serialise gated claims of one queue until the transaction ends (a lease row)."""
        from .leases import _ensure

        name = f"queue:{queue}"
        _ensure(self.alias, name)
        rows = Lease.objects.using(self.alias).filter(name=name)
        if self.connection.features.has_select_for_update:
            list(rows.select_for_update().values_list("pk"))
        else:
            rows.update(fence=F("fence"))

    def _latest(self, job_id: int) -> tuple[str, datetime | None] | None:
        row = (
            JobRun.objects.using(self.alias)
            .filter(job_id=job_id)
            .order_by("-scheduled_at", "-id")
            .values_list("state", "finished_at")
            .first()
        )
        return row

    # -- write-back ---------------------------------------------------------------------------

    def finish(
        self,
        won: Won,
        node: str,
        state: str,
        now: datetime,
        *,
        result: Any = None,
        error: str = "",
        traceback: str = "",
    ) -> bool:
        """Record a run's end if this node still holds its fence; False means fenced out."""
        with transaction.atomic(using=self.alias):
            updated = (
                JobRun.objects.using(self.alias)
                .filter(pk=won.run_id, fence=won.fence, state=RunState.RUNNING)
                .update(
                    state=state,
                    finished_at=now,
                    result=result,
                    error=error,
                    traceback=traceback,
                    lease_expires_at=None,
                )
            )
            kind = state if updated else EventKind.FENCED_OUT
            reason = f"{error}\n\n{traceback}".strip()
            if not updated:
                reason = f"completion as {state} rejected: fence {won.fence} is stale"
            self.record(won.run_id, kind, node, won.fence, reason, now)
        return bool(updated)

    def record(
        self, run_id: int, kind: str, node: str, fence: int | None, reason: str, now: datetime
    ) -> None:
        """Append one event to a run's timeline."""
        RunEvent.objects.using(self.alias).create(
            run_id=run_id, kind=kind, node=node, fence=fence, reason=reason, at=now
        )

    # -- nodes and heartbeats -----------------------------------------------------------------

    def db_now(self) -> datetime:
        """Return the database server's current time (aware): cluster time."""
        conn, now = self.connection, Now()
        compiler = JobDefinition.objects.using(self.alias).query.get_compiler(self.alias)
        sql, params = compiler.compile(now)
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT {sql}{conn.features.bare_select_suffix}", params)
            value = cursor.fetchone()[0]
        for convert in conn.ops.get_db_converters(now) + now.get_db_converters(conn):
            value = convert(value, now, conn)
        return value

    def heartbeat(
        self,
        node: str,
        now: datetime,
        lease_until: datetime,
        stats: NodeStats,
        runs: Collection[tuple[int, int]] = (),
    ) -> Heartbeat:
        """Renew the node row and the leases of the runs it is executing, in one transaction.

        ``runs`` are (run id, fence) pairs of what the node actually runs: a lease is renewed
        only under the fence the node holds, so a run claimed but never started (its claim's
        reply was lost), or taken over meanwhile, is never renewed by this node. The answer's
        ``owned_runs`` are those the database confirmed.
        """
        with transaction.atomic(using=self.alias):
            WorkerNode.objects.using(self.alias).filter(node_id=node).update(
                last_heartbeat=now, **stats.fields()
            )
            runs = JobRun.objects.using(self.alias).filter(
                owned_by(runs), node=node, state=RunState.RUNNING
            )
            runs.update(lease_expires_at=lease_until)
            owned = list(runs.values_list("pk", "cancel_requested"))
            status = (
                WorkerNode.objects.using(self.alias)
                .filter(node_id=node)
                .values_list("status", flat=True)
                .first()
            )
        return Heartbeat(
            status or "", frozenset(p for p, _ in owned), frozenset(p for p, c in owned if c)
        )

    def definitions_version(self) -> int:
        """Return a fingerprint of the definitions table that changes whenever any row does.

        It hashes every row's (id, updated_at), so an edit is noticed even when the server that
        saved it stamped an older time than the newest row's (a count and a maximum would miss
        it). The table holds one row per job, so this stays one small query.
        """
        rows = JobDefinition.objects.using(self.alias).order_by("pk")
        return hash(tuple(rows.values_list("pk", "updated_at")))


def owned_by(runs: Collection[tuple[int, int]]) -> Q:
    """Match exactly these (run id, fence) pairs; nothing when there are none."""
    match = Q(pk__in=[])
    for run_id, fence in runs:
        match |= Q(pk=run_id, fence=fence)
    return match


def enabled_job_ids(alias: str, job_ids: set[int], now: datetime) -> dict[int, JobDefinition]:
    """Return the definitions among ``job_ids`` that are enabled and not paused at ``now``."""
    rows = (
        JobDefinition.objects.using(alias)
        .filter(pk__in=job_ids, enabled=True)
        .filter(Q(paused_until__isnull=True) | Q(paused_until__lte=now))
    )
    return {row.pk: row for row in rows}


def slot_refused(definition: JobDefinition, claim: Claim) -> bool:
    """True when ``claim`` is an occurrence the job's mark already settled, or one that falls in
    a pause; mirrors sql.SETTLED."""
    if not claim.slot:
        return False
    paused = definition.paused_until is not None and claim.scheduled_at < definition.paused_until
    stale = claim.revision != definition.revision
    return paused or stale or claim.scheduled_at <= definition.settled_through


def takes_lane(definition: JobDefinition, outcome: str) -> bool:
    """True when a claimed run holds its job's lane (no overlap); mirrors sql.LANED."""
    return (
        definition.overlap == "skip"
        and (definition.max_concurrency or 1) <= 1
        and definition.placement == "cluster"
        and outcome in ("won", "catch_up", "external")
    )


def is_lock_timeout(exc: BaseException) -> bool:
    """True for SQLite's "database is locked" after the busy timeout: a lost race, not a crash."""
    return "database is locked" in str(exc) or "database table is locked" in str(exc)

"""Claims the batch claim cannot decide alone: overlap policies, concurrency and queue limits,
fixed-delay windows, skip rows and the gate's answer to a refused claim.

Every gated claim runs under the vendor's locks (the queue's, then the job's, so two lockers
cannot deadlock) and reads cluster time once it holds them, so a claim that waited is not stamped
as started before the run it waited for ended.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import OuterRef, QuerySet, Subquery

from ..coordination import Claim, GateResult, GateState, Refusal, Vendor, WindowResult, Won
from ..models import (
    LIVE_STATES,
    PARKED,
    Cause,
    EventKind,
    JobDefinition,
    JobRun,
    Overlap,
    RunState,
)
from ..policies.overlap import Gate
from ..ranks import rank_expression
from .runs import Runs

BUFFERED = "buffered behind a live run"


class Gates:
    """Claims under locks, and what the gate tells of a claim it refused."""

    def __init__(self, vendor: Vendor, runs: Runs) -> None:
        self.vendor, self.runs, self.alias = vendor, runs, vendor.alias

    # -- gated claims -------------------------------------------------------------------------

    def claim_gated(
        self,
        claim: Claim,
        gate: Gate,
        node: str,
        clock: Callable[[], datetime],
        lease_ttl: timedelta,
    ) -> GateResult:
        """Claim under the job's lock, applying buffer-one, cancel-other and concurrency limits."""
        with transaction.atomic(using=self.alias):
            self._lock(claim.job_id, gate)
            now = clock()
            runs = JobRun.objects.using(self.alias).filter(job_id=claim.job_id)
            if runs.filter(key=claim.key).exists():
                return GateResult()
            if self._queue_full(gate):
                reason = f"queue {gate.queue!r} limit {gate.queue_limit} reached"
                return GateResult(refusal=Refusal.QUEUE_LIMIT, reason=reason)
            live = runs.filter(state__in=LIVE_STATES).exclude(due_at=PARKED)
            cancelled: tuple[int, ...] = ()
            if gate.overlap == Overlap.BUFFER_ONE and self._release_stranded(runs, live, now):
                why = "overlap: the buffered run goes first"
                return GateResult(refusal=Refusal.OVERLAP, reason=why)
            if gate.overlap == Overlap.CANCEL_OTHER:
                cancelled = self._cancel_running(live, node, now)
            elif gate.limit is not None and live.count() >= gate.limit:
                return self._full(runs, claim, gate, now)
            won = self.vendor.claim([claim], node, now, now + lease_ttl)
        return GateResult(won=won[0] if won else None, cancelled=cancelled)

    def claim_pending_gated(
        self,
        node: str,
        job_id: int,
        gate: Gate,
        clock: Callable[[], datetime],
        lease_ttl: timedelta,
    ) -> list[Won]:
        """Take one due pending run of a limited job, under the same locks as gated claims."""
        with transaction.atomic(using=self.alias):
            self._lock(job_id, gate)
            now = clock()
            running = JobRun.objects.using(self.alias).filter(job_id=job_id, state=RunState.RUNNING)
            if self._queue_full(gate) or (gate.limit and running.count() >= gate.limit):
                return []
            return self.vendor.take_pending(node, [job_id], 1, now, now + lease_ttl)

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
            self.vendor.lock_job(job_id)
            next_check = window_decision(self._latest(job_id), now, interval, recheck)
            if next_check is not None:
                return WindowResult(next_check=next_check)
            won = self.vendor.claim([Claim(job_id, key, now)], node, now, lease_until)
        return WindowResult(won=won[0] if won else None, next_check=None if won else now + recheck)

    # -- skips and refusals -------------------------------------------------------------------

    def record_skip(self, claim: Claim, node: str, now: datetime, reason: str) -> JobRun | None:
        """Write the skipped row of an occurrence (once in the cluster); None if one exists.

        The row names no node (nothing ran); its timeline entry names the node that decided."""
        defaults = {
            "scheduled_at": claim.scheduled_at,
            "due_at": claim.scheduled_at,
            "state": RunState.SKIPPED,
            "outcome": claim.outcome,
            "node": "",
            "fence": 0,
            "reason": reason,
            "created_at": now,
            "finished_at": now,
            "payload": claim.payload,
            "priority": claim.priority,
        }
        try:
            with transaction.atomic(using=self.alias):
                run, created = JobRun.objects.using(self.alias).get_or_create(
                    job_id=claim.job_id, key=claim.key, defaults=defaults
                )
                if created:
                    self.runs.record(run.pk, EventKind.SKIPPED, node, None, reason, now)
        except IntegrityError:
            return None
        return run if created else None

    def gate_states(self, job_ids: Collection[int]) -> dict[int, GateState]:
        """Return, per job, what its claim gate saw: the definition's gate columns and the key
        of the live run holding its lane (if any). One query; explains a refused claim."""
        lane = JobRun.objects.using(self.alias).filter(live_lane=OuterRef("pk"))
        rows = (
            JobDefinition.objects.using(self.alias)
            .filter(pk__in=list(job_ids))
            .annotate(live_key=Subquery(lane.values("key")[:1]))
            .values_list("pk", "enabled", "paused_until", "settled_through", "revision", "live_key")
        )
        return {pk: GateState(*fields) for pk, *fields in rows}

    # -- under the locks ----------------------------------------------------------------------

    def _lock(self, job_id: int, gate: Gate) -> None:
        if gate.queue_limit:  # always queue before job, so two lockers cannot deadlock
            self.vendor.lock_queue(gate.queue)
        self.vendor.lock_job(job_id)

    def _queue_full(self, gate: Gate) -> bool:
        if not gate.queue_limit:
            return False
        running = JobRun.objects.using(self.alias).filter(
            state=RunState.RUNNING, job__queue=gate.queue
        )
        return running.count() >= gate.queue_limit

    def _cancel_running(self, live: QuerySet, node: str, now: datetime) -> tuple[int, ...]:
        running = list(
            live.filter(state=RunState.RUNNING, cancel_requested=False).values_list("pk", "fence")
        )
        live.filter(pk__in=[pk for pk, _ in running]).update(cancel_requested=True)
        why = "overlap policy cancel_other: a newer occurrence started"
        for pk, fence in running:
            self.runs.record(pk, EventKind.CANCEL_REQUESTED, node, fence, why, now)
        return tuple(pk for pk, _ in running)

    def _full(self, runs: QuerySet, claim: Claim, gate: Gate, now: datetime) -> GateResult:
        buffered = runs.filter(state=RunState.PENDING, due_at=PARKED)
        if gate.overlap == Overlap.BUFFER_ONE and not buffered.exists():
            JobRun.objects.using(self.alias).create(
                job_id=claim.job_id,
                key=claim.key,
                scheduled_at=claim.scheduled_at,
                due_at=PARKED,
                state=RunState.PENDING,
                outcome=claim.outcome,
                reason=BUFFERED,
                cause=Cause.BUFFERED,
                payload=claim.payload,
                priority=claim.priority,
                created_at=now,
            )
            return GateResult(buffered=True)
        if gate.overlap == Overlap.BUFFER_ONE:
            return GateResult(refusal=Refusal.OVERLAP, reason="overlap: a run is already buffered")
        if gate.overlap == Overlap.SKIP:
            why = "overlap: the previous run is still live"
            return GateResult(refusal=Refusal.OVERLAP, reason=why)
        reason = f"max_concurrency {gate.limit} reached"
        return GateResult(refusal=Refusal.CONCURRENCY, reason=reason)

    def _release_stranded(self, runs: QuerySet, live: QuerySet, now: datetime) -> bool:
        """Release a buffered run that nothing live is ahead of any more.

        The run it waited for has ended but its node has not released it yet (or died before
        it could): the buffered run goes next, so the occurrence being claimed yields to it
        rather than starting beside it.
        """
        if live.exists():
            return False
        released = runs.filter(state=RunState.PENDING, due_at=PARKED)
        if released.update(due_at=now, pending_rank=rank_expression(now)):
            transaction.on_commit(self.vendor.notify_pending, using=self.alias)
            return True
        return False

    def _latest(self, job_id: int) -> tuple[str, datetime | None] | None:
        return (
            JobRun.objects.using(self.alias)
            .filter(job_id=job_id)
            .order_by("-scheduled_at", "-id")
            .values_list("state", "finished_at")
            .first()
        )


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
    if state in LIVE_STATES or finished_at is None:
        return now + min(interval, recheck)
    due = finished_at + interval
    return None if due <= now else due

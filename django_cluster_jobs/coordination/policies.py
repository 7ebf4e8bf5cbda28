"""Fenced writes for failure and overlap policies: retry, dead letter, gated claims, breaker."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.db.models import F, OuterRef, Subquery

from ..models import (
    LIVE_STATES,
    ClusterEvent,
    ClusterEventKind,
    EventKind,
    JobDefinition,
    JobRun,
    RunState,
)

if TYPE_CHECKING:
    from .base import Claim, Won

#: Final states that count as a failure for the circuit breaker.
FAILURES = (RunState.FAILED, RunState.TIMED_OUT, RunState.DEAD, RunState.LOST)
#: Final states that end a breaker's run of failures.
SUCCESSES = (RunState.SUCCEEDED,)
#: ``due_at`` of a buffered run until the live one ends.
PARKED = datetime(9999, 12, 31, tzinfo=UTC)
BUFFERED = "buffered behind a live run"
#: How long a breaker pauses a job whose definition sets a threshold but no cooldown.
DEFAULT_COOLDOWN = timedelta(minutes=5)


@dataclass(frozen=True)
class Gate:
    """A job's overlap policy and concurrency limit, as the gated claim applies them."""

    overlap: str
    limit: int | None
    queue: str = ""
    queue_limit: int | None = None


@dataclass(frozen=True)
class GateState:
    """A job's claim gate as the database has it: why a claim of one of its occurrences failed."""

    enabled: bool
    paused_until: datetime | None
    settled_through: datetime
    revision: int = 0
    live_key: str | None = None

    def refusal(self, claim: Claim, now: datetime) -> str | None:
        """Return the skip counter of a refused claim, or None when another node won it."""
        if not self.enabled:
            return "disabled"
        until = self.paused_until
        if until is not None and (until > now or (claim.slot and claim.scheduled_at < until)):
            return "paused"
        if claim.slot and claim.revision != self.revision:
            return "changed"
        if claim.slot and claim.scheduled_at <= self.settled_through:
            return "settled"
        if self.live_key is not None and self.live_key != claim.key:
            return "overlap"
        return None


@dataclass(frozen=True)
class GateResult:
    """What a gated claim did: won, buffered, or skipped (the skip row's reason)."""

    won: Won | None = None
    buffered: bool = False
    skipped: str | None = None
    cancelled: tuple[int, ...] = ()


class PolicyMixin:
    """Policy writes shared by every coordinator; each compares the fence it was given."""

    alias: str

    def retry(
        self,
        won: Won,
        node: str,
        now: datetime,
        due_at: datetime,
        state: str,
        error: str,
        traceback: str,
    ) -> bool:
        """Send a failed attempt back to pending, due at ``due_at``, as the next attempt."""
        with transaction.atomic(using=self.alias):
            updated = (
                JobRun.objects.using(self.alias)
                .filter(pk=won.run_id, fence=won.fence, state=RunState.RUNNING)
                .update(
                    state=RunState.PENDING,
                    due_at=due_at,
                    attempt=F("attempt") + 1,
                    fence=won.fence + 1,
                    node="",
                    lease_expires_at=None,
                    error=error,
                    traceback=traceback,
                    reason="retry",
                )
            )
            if updated:
                self.record(
                    won.run_id,
                    state,
                    node,
                    won.fence,  # type: ignore[attr-defined]
                    f"{error}\n\n{traceback}".strip(),
                    now,
                )
                self.record(
                    won.run_id,
                    EventKind.RETRIED,
                    node,  # type: ignore[attr-defined]
                    won.fence + 1,
                    f"attempt {won.attempt + 1} due at {due_at:%H:%M:%S.%f}",
                    now,
                )
                transaction.on_commit(self.notify_pending, using=self.alias)  # type: ignore[attr-defined]
        return bool(updated)

    def record_skip(self, claim: Claim, node: str, now: datetime, reason: str) -> JobRun | None:
        """Write the skipped row of an occurrence (once in the cluster); None if one exists.

        The row names no node (nothing ran); its timeline entry names the node that decided."""
        try:
            with transaction.atomic(using=self.alias):
                run, created = JobRun.objects.using(self.alias).get_or_create(
                    job_id=claim.job_id,
                    key=claim.key,
                    defaults={
                        "scheduled_at": claim.scheduled_at,
                        "due_at": claim.scheduled_at,
                        "state": RunState.SKIPPED,
                        "outcome": claim.outcome,
                        "node": "",  # nothing ran: the skip belongs to no node
                        "fence": 0,
                        "reason": reason,
                        "created_at": now,
                        "finished_at": now,
                        "payload": claim.payload,
                        "priority": claim.priority,
                    },
                )
                if created:
                    self.record(
                        run.pk,
                        EventKind.SKIPPED,
                        node,
                        None,  # type: ignore[attr-defined]
                        reason,
                        now,
                    )
        except IntegrityError:
            return None
        return run if created else None

    def claim_gated(
        self,
        claim: Claim,
        gate: Gate,
        node: str,
        clock: Callable[[], datetime],
        lease_ttl: timedelta,
    ) -> GateResult:
        """Claim under the job's lock, applying buffer-one, cancel-other and concurrency limits.

        Times are read from ``clock`` once the locks are held, so a claim that waited for them
        is not stamped as started before the run it waited for ended.
        """
        with transaction.atomic(using=self.alias):
            self._lock(claim.job_id, gate)
            now = clock()
            lease_until = now + lease_ttl
            runs = JobRun.objects.using(self.alias).filter(job_id=claim.job_id)
            if runs.filter(key=claim.key).exists():
                return GateResult()
            if self._queue_full(gate):
                return GateResult(skipped=f"queue {gate.queue!r} limit {gate.queue_limit} reached")
            live = runs.filter(state__in=LIVE_STATES).exclude(due_at=PARKED)
            cancelled: tuple[int, ...] = ()
            if gate.overlap == "buffer_one" and self._release_stranded(runs, live, now):
                return GateResult(skipped="overlap: the buffered run goes first")
            if gate.overlap == "cancel_other":
                cancelled = self._cancel_running(live, node, now)
            elif gate.limit is not None and live.count() >= gate.limit:
                return self._full(runs, claim, gate, node, now)
            won = self.claim([claim], node, now, lease_until)  # type: ignore[attr-defined]
        return GateResult(won=won[0] if won else None, cancelled=cancelled)

    def _cancel_running(self, live, node: str, now: datetime) -> tuple[int, ...]:
        running = list(
            live.filter(state=RunState.RUNNING, cancel_requested=False).values_list("pk", "fence")
        )
        live.filter(pk__in=[pk for pk, _ in running]).update(cancel_requested=True)
        for pk, fence in running:
            self.record(
                pk,
                EventKind.CANCEL_REQUESTED,
                node,
                fence,  # type: ignore[attr-defined]
                "overlap policy cancel_other: a newer occurrence started",
                now,
            )
        return tuple(pk for pk, _ in running)

    def _full(self, runs, claim: Claim, gate: Gate, node: str, now: datetime) -> GateResult:
        if (
            gate.overlap == "buffer_one"
            and not runs.filter(state=RunState.PENDING, due_at=PARKED).exists()
        ):
            JobRun.objects.using(self.alias).create(
                job_id=claim.job_id,
                key=claim.key,
                scheduled_at=claim.scheduled_at,
                due_at=PARKED,
                state=RunState.PENDING,
                outcome=claim.outcome,
                reason=BUFFERED,
                payload=claim.payload,
                priority=claim.priority,
                created_at=now,
            )
            return GateResult(buffered=True)
        reasons = {
            "buffer_one": "overlap: a run is already buffered",
            "skip": "overlap: the previous run is still live",
        }
        return GateResult(
            skipped=reasons.get(gate.overlap, f"max_concurrency {gate.limit} reached")
        )

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
            lease_until = now + lease_ttl
            running = JobRun.objects.using(self.alias).filter(job_id=job_id, state=RunState.RUNNING)
            if self._queue_full(gate) or (gate.limit and running.count() >= gate.limit):
                return []
            return self.claim_pending(node, [job_id], 1, now, lease_until)  # type: ignore[attr-defined]

    def _lock(self, job_id: int, gate: Gate) -> None:
        if gate.queue_limit:  # always queue before job, so two lockers cannot deadlock
            self.lock_queue(gate.queue)  # type: ignore[attr-defined]
        self.lock_job(job_id)  # type: ignore[attr-defined]

    def _queue_full(self, gate: Gate) -> bool:
        if not gate.queue_limit:
            return False
        running = JobRun.objects.using(self.alias).filter(
            state=RunState.RUNNING, job__queue=gate.queue
        )
        return running.count() >= gate.queue_limit

    def gate_states(self, job_ids: Collection[int]) -> dict[int, GateState]:
        """Return, per job, what its claim gate saw: the definition's gate columns and the key
        of the live run holding its lane (if any). One query; explains a refused claim."""
        lane = JobRun.objects.using(self.alias).filter(lane=OuterRef("pk"), state__in=LIVE_STATES)
        rows = (
            JobDefinition.objects.using(self.alias)
            .filter(pk__in=list(job_ids))
            .annotate(live_key=Subquery(lane.values("key")[:1]))
            .values_list(
                "pk", "enabled", "paused_until", "settled_through", "revision", "live_key"
            )
        )
        return {pk: GateState(*fields) for pk, *fields in rows}

    def _release_stranded(self, runs, live, now: datetime) -> bool:
        """Release a buffered run that nothing live is ahead of any more.

        The run it waited for has ended but its node has not released it yet (or died before
        it could): the buffered run goes next, so the occurrence being claimed yields to it
        rather than starting beside it.
        """
        if live.exists():
            return False
        released = runs.filter(state=RunState.PENDING, due_at=PARKED).update(due_at=now)
        if released:
            transaction.on_commit(self.notify_pending, using=self.alias)  # type: ignore[attr-defined]
        return bool(released)

    def release_buffered(self, job_id: int, now: datetime) -> int:
        """Make the job's buffered run due now (its predecessor ended)."""
        released = (
            JobRun.objects.using(self.alias)
            .filter(job_id=job_id, state=RunState.PENDING, due_at=PARKED)
            .update(due_at=now)
        )
        if released:
            self.notify_pending()  # type: ignore[attr-defined]
        return released

    def open_breaker_if_tripped(
        self, job_id: int, threshold: int, cooldown: timedelta | None, now: datetime
    ) -> datetime | None:
        """Pause the job for ``cooldown`` if its last ``threshold`` finished runs all failed.

        The pause goes through ``save()`` like an operator's: what fell due before it is
        settled, nothing during it is caught up.
        """
        recent = list(
            JobRun.objects.using(self.alias)
            .filter(job_id=job_id, state__in=(*FAILURES, *SUCCESSES))
            .order_by("-finished_at", "-pk")
            .values_list("state", flat=True)[:threshold]
        )
        if len(recent) < threshold or any(s in SUCCESSES for s in recent):
            return None
        until = now + (cooldown or DEFAULT_COOLDOWN)
        reason = (
            f"circuit breaker: {threshold} consecutive failed runs; resumes at {until:%H:%M:%S}"
        )
        with transaction.atomic(using=self.alias):
            job = JobDefinition.objects.using(self.alias).filter(pk=job_id).first()
            if job is None or (job.paused_until is not None and job.paused_until > now):
                return None
            job.paused_until, job.pause_reason = until, reason
            job.save(using=self.alias, update_fields=["paused_until", "pause_reason", "updated_at"])
            ClusterEvent.objects.using(self.alias).create(
                at=now, kind=ClusterEventKind.BREAKER_OPENED, detail=f"{job.name}: {reason}"
            )
        return until

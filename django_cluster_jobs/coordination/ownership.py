"""Who owns a run after a crash, a pause or a drain: pickup, reaping, hand-back, dead nodes, purge.

These are the portable ORM versions; every write compares the fencing token it read, so a writer
that lost the race changes nothing. Dialect modules override the hot ones.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import F, Min, OuterRef, Subquery

from ..models import (
    LIVE_STATES,
    ClusterEvent,
    ClusterEventKind,
    Delivery,
    EventKind,
    JobDefinition,
    JobRun,
    NodeStatus,
    RunEvent,
    RunState,
    ScheduleKind,
    WorkerNode,
)

if TYPE_CHECKING:
    from .base import Won

#: Reasons stored on a run that went back to pending because its owner went away.
LEASE_EXPIRED = "lease expired"
HANDED_BACK = "handed back"
#: Takeovers allowed beyond a job's max_attempts before the run is dead-lettered (poison pill).
MAX_TAKEOVERS = 2
#: Most finished runs one purge deletes (the next purge takes the rest).
PURGE_BATCH = 10_000


class OwnershipMixin:
    """Run ownership operations shared by every coordinator."""

    alias: str

    def notify_pending(self) -> None:
        """Wake idle nodes because a run became pending (PostgreSQL NOTIFY; no-op elsewhere)."""

    # -- pending runs -----------------------------------------------------------------------

    def claim_pending(
        self, node: str, job_ids: Collection[int], limit: int, now: datetime, lease_until: datetime
    ) -> list[Won]:
        """Take up to ``limit`` due pending runs of ``job_ids``, by priority with aging."""
        from .pending import pick, won_of

        if not job_ids or limit < 1:
            return []
        with transaction.atomic(using=self.alias):
            due = JobRun.objects.using(self.alias).due(now).filter(job_id__in=job_ids)
            skip = self.connection.features.has_select_for_update_skip_locked  # type: ignore[attr-defined]
            taken = []
            for pk, fence, reason in pick(due, limit, now, skip_locked=skip):
                if self._take(pk, fence, node, now, lease_until, reason):
                    taken.append(won_of(JobRun.objects.using(self.alias).get(pk=pk)))
        return taken

    def _take(
        self, pk: int, fence: int, node: str, now: datetime, lease_until: datetime, reason: str
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
            taken_over = reason.startswith((LEASE_EXPIRED, HANDED_BACK))
            kind = EventKind.TAKEN_OVER if taken_over else EventKind.STARTED
            self.record(pk, kind, node, fence + 1, reason, now)  # type: ignore[attr-defined]
        return bool(updated)

    def next_pending_due(self, job_ids: Collection[int]) -> datetime | None:
        """Return when the earliest pending run of ``job_ids`` is due, or None."""
        runs = JobRun.objects.using(self.alias).filter(state=RunState.PENDING, job_id__in=job_ids)
        return runs.aggregate(due=Min("due_at"))["due"]

    # -- giving runs back ---------------------------------------------------------------------

    def hand_back(
        self, won: Won, node: str, now: datetime, reason: str = HANDED_BACK
    ) -> str | None:
        """Release a run this node cannot finish: pending again (at least once) or lost (at most
        once). Returns the new state, or None when the fence was already stale."""
        delivery = (
            JobRun.objects.using(self.alias)
            .filter(pk=won.run_id)
            .values_list("job__delivery", flat=True)
            .first()
        )
        with transaction.atomic(using=self.alias):
            state = self._release(won.run_id, won.fence, node, now, reason, delivery)
        return state

    def _release(
        self,
        pk: int,
        fence: int,
        node: str,
        now: datetime,
        reason: str,
        delivery: str | None,
        *,
        expired: bool = False,
    ) -> str | None:
        runs = JobRun.objects.using(self.alias).filter(pk=pk, fence=fence, state=RunState.RUNNING)
        if expired:  # the reaper: a lease renewed since it was read is no longer expired
            runs = runs.filter(lease_expires_at__lt=now)
        if delivery == Delivery.AT_MOST_ONCE:
            lost = runs.update(
                state=RunState.LOST,
                finished_at=now,
                lease_expires_at=None,
                fence=fence + 1,
                reason=f"{reason} (at most once: not re-run)",
            )
            if lost:
                transaction.on_commit(
                    lambda: _signal(self.alias, "run_lost", pk, node, reason=reason),
                    using=self.alias,
                )
                self.record(
                    pk,
                    EventKind.LOST,
                    node,
                    fence + 1,  # type: ignore[attr-defined]
                    f"{reason}; at-most-once delivery, never re-run",
                    now,
                )
            return RunState.LOST if lost else None
        back = runs.update(
            state=RunState.PENDING,
            due_at=now,
            node="",
            lease_expires_at=None,
            fence=fence + 1,
            attempt=F("attempt") + 1,
            reason=reason,
        )
        if back:
            kind = EventKind.HANDED_BACK if reason == HANDED_BACK else EventKind.LEASE_EXPIRED
            self.record(
                pk,
                kind,
                node,
                fence + 1,  # type: ignore[attr-defined]
                f"{reason}; pending again as the next attempt",
                now,
            )
            transaction.on_commit(self.notify_pending, using=self.alias)
        return RunState.PENDING if back else None

    # -- leader chores (callers hold the leader lease, checked in the same transaction) -------

    def reap_expired(self, now: datetime, leader: str) -> int:
        """Release every run whose lease expired before ``now``; return how many."""
        expired = (
            JobRun.objects.using(self.alias)
            .expired(now)
            .values_list("pk", "fence", "node", "job__delivery", "attempt", "job__max_attempts")
        )
        count = 0
        for pk, fence, owner, delivery, attempt, max_attempts in expired:
            if attempt >= max_attempts + MAX_TAKEOVERS and delivery != Delivery.AT_MOST_ONCE:
                count += self._bury(pk, fence, leader, now, owner)
                continue
            reason = f"{LEASE_EXPIRED} on {owner}"
            if self._release(pk, fence, leader, now, reason, delivery, expired=True):
                count += 1
        return count

    def _bury(self, pk: int, fence: int, leader: str, now: datetime, owner: str) -> int:
        updated = (
            JobRun.objects.using(self.alias)
            .filter(pk=pk, fence=fence, state=RunState.RUNNING, lease_expires_at__lt=now)
            .update(
                state=RunState.DEAD,
                finished_at=now,
                lease_expires_at=None,
                fence=fence + 1,
                reason="lease expired too often (the handler may kill its node)",
            )
        )
        if updated:
            reason = "lease expired too often; dead-lettered after repeated takeovers"
            transaction.on_commit(
                lambda: _signal(self.alias, "run_dead_lettered", pk, leader, error=reason),
                using=self.alias,
            )
            self.record(
                pk,
                EventKind.DEAD_LETTERED,
                leader,
                fence + 1,  # type: ignore[attr-defined]
                f"lease expired on {owner} again; dead-lettered after repeated takeovers",
                now,
            )
        return updated

    def mark_dead_nodes(self, now: datetime, dead_after: timedelta, leader: str) -> list[str]:
        """Mark nodes silent for longer than ``dead_after`` dead; return their ids."""
        silent = WorkerNode.objects.using(self.alias).filter(
            status__in=(NodeStatus.ACTIVE, NodeStatus.DRAINING), last_heartbeat__lt=now - dead_after
        )
        dead = list(silent.values_list("node_id", flat=True))
        silent.filter(node_id__in=dead).update(status=NodeStatus.DEAD)
        ClusterEvent.objects.using(self.alias).bulk_create(
            [
                ClusterEvent(
                    at=now,
                    kind=ClusterEventKind.NODE_DEAD,
                    node=node_id,
                    detail=f"no heartbeat for over {dead_after.total_seconds():g}s; "
                    f"marked dead by {leader}",
                )
                for node_id in dead
            ]
        )
        return dead

    def purge(self, now: datetime, keep: timedelta) -> int:
        """Delete finished runs that ended more than ``keep`` ago, with their events.

        No recovery decision reads a row at or before its job's ``settled_through`` mark (the
        mark stands for it), so any such finished row may go, except the latest run of each
        fixed-delay job: its end times the next run. Rows after the mark are still read by the
        next settling pass and stay, however short the retention.
        """
        old = JobRun.objects.using(self.alias).exclude(state__in=LIVE_STATES)
        old = old.filter(finished_at__lt=now - keep, scheduled_at__lte=F("job__settled_through"))
        old = old.exclude(pk__in=_latest_delay_runs(self.alias))
        ids = list(old.values_list("pk", flat=True)[:PURGE_BATCH])
        RunEvent.objects.using(self.alias).filter(run_id__in=ids).delete()
        deleted, _ = JobRun.objects.using(self.alias).filter(pk__in=ids).delete()
        return len(ids) if deleted else 0


def _latest_delay_runs(alias: str) -> Subquery:
    """The latest run of each fixed-delay job (what its next window claim is timed from)."""
    latest = (
        JobRun.objects.using(alias)
        .filter(job_id=OuterRef("pk"))
        .order_by("-scheduled_at", "-pk")
        .values("pk")[:1]
    )
    delays = JobDefinition.objects.using(alias).filter(schedule_kind=ScheduleKind.DELAY)
    return Subquery(delays.annotate(latest=Subquery(latest)).values("latest"))


def _signal(alias: str, name: str, pk: int, node: str, **kwargs: object) -> None:
    """Send the lifecycle signal ``name`` for run ``pk`` once its write has committed."""
    from .. import signals

    run = JobRun.objects.using(alias).select_related("job").filter(pk=pk).first()
    if run is not None:
        signals.send(
            getattr(signals, name),
            run.job.name,
            run_id=pk,
            key=run.key,
            node=node,
            attempt=run.attempt,
            **kwargs,
        )

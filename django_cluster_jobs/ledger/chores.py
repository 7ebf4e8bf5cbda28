"""The leader's writes: release expired leases, bury poison runs, mark silent nodes dead, purge.

The leader runs them in its fenced chores transaction (a deposed leader's are rejected whole);
each is also a compare-and-set on the rows it changes, so a chore never undoes a newer owner's
work.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, OuterRef, Subquery

from ..coordination import Vendor
from ..models import (
    LEADER_LEASE,
    LIVE_NODE,
    LIVE_STATES,
    Cause,
    ClusterEvent,
    ClusterEventKind,
    Delivery,
    EventKind,
    JobDefinition,
    JobRun,
    Lease,
    NodeStatus,
    RunEvent,
    RunLog,
    RunState,
    ScheduleKind,
    WorkerNode,
)
from .runs import Runs
from .signals import after_commit

#: Takeovers allowed beyond a job's max_attempts before the run is dead-lettered (poison pill).
MAX_TAKEOVERS = 2
#: Most finished runs one purge deletes (the next purge takes the rest).
PURGE_BATCH = 10_000


class Chores:
    """The cluster's singleton writes."""

    def __init__(self, vendor: Vendor, runs: Runs) -> None:
        self.vendor, self.runs, self.alias = vendor, runs, vendor.alias

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
            reason = f"lease expired on {owner}"
            released = self.runs.release(
                pk, fence, leader, now, Cause.LEASE_EXPIRED, reason, delivery, expired=True
            )
            count += released is not None
        return count

    def _bury(self, pk: int, fence: int, leader: str, now: datetime, owner: str) -> int:
        with transaction.atomic(using=self.alias):
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
                self.runs.flows.after_end(pk, now)
        if updated:
            error = "lease expired too often; dead-lettered after repeated takeovers"
            after_commit(self.alias, "run_dead_lettered", pk, leader, error=error)
            why = f"lease expired on {owner} again; dead-lettered after repeated takeovers"
            self.runs.record(pk, EventKind.DEAD_LETTERED, leader, fence + 1, why, now)
        return updated

    def mark_dead_nodes(self, now: datetime, dead_after: timedelta, leader: str) -> list[str]:
        """Mark nodes silent for longer than ``dead_after`` dead; return their ids."""
        silent = WorkerNode.objects.using(self.alias).filter(
            status__in=LIVE_NODE, last_heartbeat__lt=now - dead_after
        )
        dead = list(silent.values_list("node_id", flat=True))
        silent.filter(node_id__in=dead).update(status=NodeStatus.DEAD)
        detail = f"no heartbeat for over {dead_after.total_seconds():g}s; marked dead by {leader}"
        ClusterEvent.objects.using(self.alias).bulk_create(
            ClusterEvent(at=now, kind=ClusterEventKind.NODE_DEAD, node=node_id, detail=detail)
            for node_id in dead
        )
        return dead

    def node_lost(self, node_id: str, process: str, by: str, now: datetime, how: str) -> int | None:
        """Release the running runs of a node whose process ended, at once (not at lease expiry).

        ``process`` is the registration seen alive (WorkerNode.process): nothing is done when the
        row has another one since (the node restarted and registered again, so its runs are no
        longer the dead process's) or is gone. The node is marked dead when it was
        live, a leader lease it held is freed, and its runs go the way of an expired lease:
        pending again (at least once) or lost (at most once), each fenced. Returns how many runs
        were released, or None when the row had changed.
        """
        with transaction.atomic(using=self.alias):
            rows = WorkerNode.objects.using(self.alias).filter(node_id=node_id, process=process)
            if not list(rows.select_for_update().values_list("pk", flat=True)):
                return None
            detail = f"{how}; marked dead by {by}"
            if rows.filter(status__in=LIVE_NODE).update(status=NodeStatus.DEAD):
                ClusterEvent.objects.using(self.alias).create(
                    at=now, kind=ClusterEventKind.NODE_DEAD, node=node_id, detail=detail
                )
            Lease.objects.using(self.alias).filter(
                name=LEADER_LEASE, holder=node_id, expires_at__gt=now
            ).update(expires_at=now)
            running = (
                JobRun.objects.using(self.alias)
                .filter(node=node_id, state=RunState.RUNNING)
                .values_list("pk", "fence", "job__delivery")
            )
            reason = f"node {node_id} ended ({how})"
            released = 0
            for pk, fence, delivery in running:
                state = self.runs.release(pk, fence, by, now, Cause.NODE_LOST, reason, delivery)
                released += state is not None
        return released

    def purge(self, now: datetime, keep: timedelta) -> int:
        """Delete finished runs that ended more than ``keep`` ago, with their events and logs.

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
        RunLog.objects.using(self.alias).filter(run_id__in=ids).delete()
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
    # A fixed-delay job with no run yet has no latest: leave its NULL out, or NOT IN (…, NULL)
    # would be true of no row and purge nothing at all.
    latest_of = delays.annotate(latest=Subquery(latest)).filter(latest__isnull=False)
    return Subquery(latest_of.values("latest"))

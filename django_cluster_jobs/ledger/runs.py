"""Fenced writes on one run: its end, its retry, its release, and its timeline.

Each write compares the fencing token the writer holds, so a writer that lost the run (its lease
expired and another node took it) changes nothing: the write matches zero rows and is recorded
as fenced out. Written once over the ORM for every database.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F, QuerySet

from ..bounds import REASON_MAX_LENGTH
from ..coordination import Ending, Vendor, Won
from ..models import PARKED, Cause, Delivery, EventKind, JobRun, RunEvent, RunLog, RunState
from ..ranks import rank_expression
from .flows import Flows
from .signals import after_commit

#: The timeline entry of a run released by its cause.
RELEASED_KIND: dict[str, str] = {
    Cause.HANDED_BACK: EventKind.HANDED_BACK,
    Cause.NODE_LOST: EventKind.NODE_LOST,
}

#: Releases that take a run from an owner that went away (not one a stopping node handed back).
TAKEOVERS = (Cause.LEASE_EXPIRED, Cause.NODE_LOST)


class Runs:
    """What the node that holds a run writes about it."""

    def __init__(self, vendor: Vendor) -> None:
        self.vendor, self.alias = vendor, vendor.alias
        self.flows = Flows(vendor)

    def held(self, won: Won) -> QuerySet[JobRun]:
        """The run ``won`` names, while it is still running under that fence."""
        return JobRun.objects.using(self.alias).filter(
            pk=won.run_id, fence=won.fence, state=RunState.RUNNING
        )

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
        leads: bool = False,
    ) -> bool:
        """Record a run's end if this node still holds its fence; False means fenced out.

        ``leads``: other jobs wait for this one; they are queued or skipped (``flows``) in the
        transaction that records the end, so a crash cannot lose them.
        """
        if not leads:
            return self._finish(won, node, state, now, result, error, traceback)
        with transaction.atomic(using=self.alias):
            written = self._finish(won, node, state, now, result, error, traceback)
            if written:
                self.flows.after_end(won.run_id, now)
        return written

    def _finish(
        self, won: Won, node: str, state: str, now: datetime, result: Any, error: str,
        traceback: str,
    ) -> bool:  # fmt: skip
        reason = f"{error}\n\n{traceback}".strip()
        fenced = f"completion as {state} rejected: fence {won.fence} is stale"
        ending = Ending(result, error, traceback, reason, fenced)
        written = self.vendor.finish(won, node, state, now, ending)
        if written is not None:  # one statement where the database can
            return written
        with transaction.atomic(using=self.alias):
            updated = self.held(won).update(
                state=state,
                finished_at=now,
                result=result,
                error=error,
                traceback=traceback,
                lease_expires_at=None,
            )
            kind = state if updated else EventKind.FENCED_OUT
            self.record(won.run_id, kind, node, won.fence, reason if updated else fenced, now)
        return bool(updated)

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
            updated = self.held(won).update(
                state=RunState.PENDING,
                due_at=due_at,
                pending_rank=rank_expression(due_at),
                attempt=F("attempt") + 1,
                fence=won.fence + 1,
                node="",
                lease_expires_at=None,
                error=error,
                traceback=traceback,
                reason="retry",
                cause=Cause.RETRY,
            )
            if updated:
                failure = f"{error}\n\n{traceback}".strip()
                self.record(won.run_id, state, node, won.fence, failure, now)
                next_attempt = f"attempt {won.attempt + 1} due at {due_at:%H:%M:%S.%f}"
                self.record(won.run_id, EventKind.RETRIED, node, won.fence + 1, next_attempt, now)
                transaction.on_commit(self.vendor.notify_pending, using=self.alias)
        return bool(updated)

    def hand_back(
        self, won: Won, node: str, now: datetime, cause: str = Cause.HANDED_BACK
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
            return self.release(won.run_id, won.fence, node, now, cause, "handed back", delivery)

    def release(
        self,
        pk: int,
        fence: int,
        node: str,
        now: datetime,
        cause: str,
        reason: str,
        delivery: str | None,
        *,
        expired: bool = False,
    ) -> str | None:
        """Release a running run under ``fence``: lost (at most once) or pending again as the
        next attempt. With ``expired`` (the reaper) only while its lease is still expired."""
        runs = JobRun.objects.using(self.alias).filter(pk=pk, fence=fence, state=RunState.RUNNING)
        if expired:  # a lease renewed since the reaper read it is no longer expired
            runs = runs.filter(lease_expires_at__lt=now)
        if delivery == Delivery.AT_MOST_ONCE:
            return self._lose(runs, pk, fence, node, now, reason)
        back = runs.update(
            state=RunState.PENDING,
            due_at=now,
            pending_rank=rank_expression(now),
            node="",
            lease_expires_at=None,
            fence=fence + 1,
            attempt=F("attempt") + 1,
            reason=reason[:REASON_MAX_LENGTH],  # a node id may take most of it
            cause=cause,
        )
        if back:
            if cause in TAKEOVERS:
                after_commit(self.alias, "run_taken_over", pk, node, cause=cause, reason=reason)
            kind = RELEASED_KIND.get(cause, EventKind.LEASE_EXPIRED)
            again = f"{reason}; pending again as the next attempt"
            self.record(pk, kind, node, fence + 1, again, now)
            transaction.on_commit(self.vendor.notify_pending, using=self.alias)
        return RunState.PENDING if back else None

    def _lose(self, runs, pk: int, fence: int, node: str, now: datetime, reason: str) -> str | None:
        with transaction.atomic(using=self.alias):
            lost = runs.update(
                state=RunState.LOST,
                finished_at=now,
                lease_expires_at=None,
                fence=fence + 1,
                reason=f"{reason} (at most once: not re-run)"[:REASON_MAX_LENGTH],
            )
            if not lost:
                return None
            self.flows.after_end(pk, now)
        after_commit(self.alias, "run_lost", pk, node, reason=reason)
        self.record(pk, EventKind.LOST, node, fence + 1,
                    f"{reason}; at-most-once delivery, never re-run", now)  # fmt: skip
        return RunState.LOST

    def release_buffered(self, job_id: int, now: datetime) -> int:
        """Make the job's buffered run due now (its predecessor ended)."""
        released = (
            JobRun.objects.using(self.alias)
            .filter(job_id=job_id, state=RunState.PENDING, due_at=PARKED)
            .update(due_at=now, pending_rank=rank_expression(now))
        )
        if released:
            self.vendor.notify_pending()
        return released

    def store_log(
        self, won: Won, node: str, lines: Iterable[tuple[datetime, int, str]], trace_id: str
    ) -> bool:
        """Store an attempt's log lines (at, level, message) with its run, in one insert, while
        this node holds the run's fence (the row locked against a takeover meanwhile); False,
        and nothing stored, when fenced out."""
        with transaction.atomic(using=self.alias):
            if not self.held(won).select_for_update().exists():
                return False
            RunLog.objects.using(self.alias).bulk_create(
                RunLog(run_id=won.run_id, at=at, level=level, attempt=won.attempt, node=node,
                       trace_id=trace_id, message=message)
                for at, level, message in lines
            )  # fmt: skip
        return True

    def record(
        self, run_id: int, kind: str, node: str, fence: int | None, reason: str, now: datetime
    ) -> None:
        """Append one event to a run's timeline."""
        RunEvent.objects.using(self.alias).create(
            run_id=run_id, kind=kind, node=node, fence=fence, reason=reason, at=now
        )

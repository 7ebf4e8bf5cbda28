"""Dependencies between jobs: what a run's end means for the jobs that wait for it.

A workflow instance is started by a run of a root job (one that waits for none); its id is that
run's id, and every dependent run carries it (``JobRun.instance``). When a run ends, the
transaction that records its end also decides its dependents in the same instance
(:meth:`Flows.after_end`): on success, a dependent whose every predecessor has now succeeded is
queued as a pending run; on a failure for good, it is recorded skipped, and so on down the graph.

Each dependent's run in an instance has the key ``after:<instance>``, so the job's unique
``(job, key)`` claim lets one row exist per (job, instance) whatever the number of racers. The
decision is serialized per dependent job (``vendor.lock_job``, taken in id order): of two
predecessors that succeed at the same instant on two nodes, the second to take the lock sees
the first's success, so the last one to finish queues the dependent, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction

from ..coordination import Vendor
from ..models import (
    Cause,
    EventKind,
    JobDefinition,
    JobRun,
    Outcome,
    RunEvent,
    RunState,
)
from ..ranks import rank_expression

#: The ends of a predecessor after which its dependents in the instance never run (unless the
#: predecessor is replayed and succeeds).
ENDED_FOR_GOOD = (
    RunState.FAILED,
    RunState.TIMED_OUT,
    RunState.CANCELLED,
    RunState.LOST,
    RunState.DEAD,
    RunState.SKIPPED,
)


def step_key(instance: int) -> str:
    """The key of a dependent's run in ``instance``: the claim on (job, instance)."""
    return f"{Outcome.AFTER}:{instance}"


@dataclass(frozen=True)
class Ended:
    """A run that ended, as its dependents need it."""

    pk: int
    job: str
    state: str
    instance: int


class Flows:
    """Queues or skips the dependents of a run that ended, in the transaction of its end."""

    def __init__(self, vendor: Vendor) -> None:
        self.vendor, self.alias = vendor, vendor.alias

    def after_end(self, run_id: int, now: datetime) -> int:
        """Decide the dependents of run ``run_id`` by the end it was just given; return how
        many runs were queued or skipped. Call inside the transaction that recorded the end."""
        row = (
            JobRun.objects.using(self.alias)
            .filter(pk=run_id)
            .values_list("pk", "job__name", "state", "instance")
            .first()
        )
        if row is None:
            return 0
        pk, job, state, instance = row
        return self._decide(Ended(pk, job, state, instance or pk), now)

    def _decide(self, ended: Ended, now: datetime) -> int:
        if ended.state != RunState.SUCCEEDED and ended.state not in ENDED_FOR_GOOD:
            return 0
        jobs = JobDefinition.objects.using(self.alias)
        dependents = sorted(jobs.dependents_of(ended.job).values_list("pk", "name", "after"))
        decided = 0
        for pk, name, after in dependents:
            self.vendor.lock_job(pk)
            if ended.state == RunState.SUCCEEDED:
                decided += self._queue_if_ready(ended, pk, after, now)
            else:
                decided += self._skip(ended, pk, name, now)
        return decided

    def _queue_if_ready(self, ended: Ended, job_id: int, after: list[str], now: datetime) -> int:
        """Queue the dependent once every predecessor succeeded in the instance; a run of it
        skipped there (a predecessor failed, then was replayed) is made pending again."""
        runs = JobRun.objects.using(self.alias).in_instance(ended.instance)
        done = set(runs.succeeded().filter(job__name__in=after).values_list("job__name", flat=True))
        if done != set(after):
            return 0
        key, reason = step_key(ended.instance), f"after {ended.job} succeeded (run {ended.pk})"
        resumed = (
            JobRun.objects.using(self.alias)
            .filter(job_id=job_id, key=key, state=RunState.SKIPPED)
            .update(state=RunState.PENDING, due_at=now, pending_rank=rank_expression(now),
                    finished_at=None, origin_id=ended.pk, reason=reason, cause=Cause.FIRST)
        )  # fmt: skip
        if not resumed and not self._insert(ended, job_id, key, RunState.PENDING, reason, now):
            return 0
        transaction.on_commit(self.vendor.notify_pending, using=self.alias)
        return 1

    def _skip(self, ended: Ended, job_id: int, name: str, now: datetime) -> int:
        """Record the dependent skipped in the instance, naming the predecessor, then its own
        dependents in turn."""
        key = step_key(ended.instance)
        reason = f"predecessor {ended.job} ended {ended.state} (run {ended.pk})"
        run = self._insert(ended, job_id, key, RunState.SKIPPED, reason, now)
        if run is None:  # already decided in this instance: queued, run or skipped
            return 0
        RunEvent.objects.using(self.alias).create(
            run_id=run.pk, kind=EventKind.SKIPPED, node="", reason=reason, at=now
        )
        return 1 + self._decide(Ended(run.pk, name, RunState.SKIPPED, ended.instance), now)

    def _insert(
        self, ended: Ended, job_id: int, key: str, state: str, reason: str, now: datetime
    ) -> JobRun | None:
        """Insert the dependent's run in the instance; None when it exists already."""
        priority = (
            JobDefinition.objects.using(self.alias)
            .filter(pk=job_id)
            .values_list("priority", flat=True)
            .first()
        )
        run = JobRun(
            job_id=job_id, key=key, scheduled_at=now, due_at=now, state=state,
            outcome=Outcome.AFTER, priority=priority or 0, instance=ended.instance,
            origin_id=ended.pk, created_at=now, reason=reason[:200],
            cause=Cause.UPSTREAM if state == RunState.SKIPPED else Cause.FIRST,
            finished_at=now if state == RunState.SKIPPED else None,
        )  # fmt: skip
        try:
            with transaction.atomic(using=self.alias):
                run.save(using=self.alias, force_insert=True)
        except IntegrityError:  # the unique (job, key) claim: decided already
            return None
        return run

"""The circuit breaker: a job whose last runs all failed is paused for a cool-down."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction

from ..bounds import DEFAULT_COOLDOWN
from ..models import (
    ClusterEvent,
    ClusterEventKind,
    JobDefinition,
    JobRun,
    PauseCause,
    RunState,
)

#: Final states that count as a failure for the circuit breaker.
FAILURES = (RunState.FAILED, RunState.TIMED_OUT, RunState.DEAD, RunState.LOST)
#: Final states that end a breaker's run of failures.
SUCCESSES = (RunState.SUCCEEDED,)


def open_if_tripped(
    alias: str, job_id: int, threshold: int, cooldown: timedelta | None, now: datetime
) -> datetime | None:
    """Pause the job for ``cooldown`` if its last ``threshold`` finished runs all failed.

    The pause goes through ``save()`` like an operator's: what fell due before it is settled,
    nothing during it is caught up. Returns when it resumes, or None when it did not open.
    """
    recent = list(
        JobRun.objects.using(alias)
        .filter(job_id=job_id, state__in=(*FAILURES, *SUCCESSES))
        .order_by("-finished_at", "-pk")
        .values_list("state", flat=True)[:threshold]
    )
    if len(recent) < threshold or any(s in SUCCESSES for s in recent):
        return None
    until = now + (cooldown or DEFAULT_COOLDOWN)
    reason = f"circuit breaker: {threshold} consecutive failed runs; resumes at {until:%H:%M:%S}"
    with transaction.atomic(using=alias):
        job = JobDefinition.objects.using(alias).filter(pk=job_id).first()
        if job is None or job.is_paused_at(now):
            return None
        job.paused_until, job.pause_reason, job.pause_cause = until, reason, PauseCause.BREAKER
        fields = ["paused_until", "pause_reason", "pause_cause", "updated_at"]
        job.save(using=alias, update_fields=fields)
        ClusterEvent.objects.using(alias).create(
            at=now, kind=ClusterEventKind.BREAKER_OPENED, detail=f"{job.name}: {reason}"
        )
    return until

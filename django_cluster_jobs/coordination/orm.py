"""The portable path: ORM get_or_create per claim; the reference the fast paths must agree with."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import DatabaseError, IntegrityError, transaction

from ..models import EventKind, JobRun, RunEvent, RunState
from .base import (
    Claim,
    Coordinator,
    Won,
    enabled_job_ids,
    is_lock_timeout,
    slot_refused,
    takes_lane,
)


class ORMCoordinator(Coordinator):
    """Works on any database Django supports: one get_or_create per claim."""

    vendor = "orm"

    def claim(
        self, claims: Sequence[Claim], node: str, now: datetime, lease_until: datetime
    ) -> list[Won]:
        allowed = enabled_job_ids(self.alias, {c.job_id for c in claims}, now)
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

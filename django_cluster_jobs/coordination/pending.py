"""Taking pending runs with one UPDATE … RETURNING, shared by the PostgreSQL and SQLite paths."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from ..models import JobRun
from . import sql
from .base import Won, dt_param


def take_pending(
    cursor: Any,
    connection: Any,
    alias: str,
    node: str,
    job_ids: Collection[int],
    limit: int,
    now: datetime,
    lease_until: datetime,
    lock: str,
) -> list[Won]:
    """Run TAKE_PENDING and its events on ``cursor`` (inside the caller's transaction)."""
    if not job_ids or limit < 1:
        return []
    marks = ", ".join(["%s"] * len(job_ids))
    at = dt_param(connection, now)
    params = [node, dt_param(connection, lease_until), at, at, *job_ids, limit]
    cursor.execute(sql.TAKE_PENDING.format(job_ids=marks, lock=lock), params)
    ids = [row[0] for row in cursor.fetchall()]
    if not ids:
        return []
    cursor.execute(sql.TAKEN_EVENTS.format(ids=", ".join(["%s"] * len(ids))), [at, *ids])
    rows = JobRun.objects.using(alias).filter(pk__in=ids).order_by("-priority", "due_at", "pk")
    return [Won(r.pk, r.job_id, r.key, r.fence, r.attempt, r.scheduled_at, r.payload) for r in rows]

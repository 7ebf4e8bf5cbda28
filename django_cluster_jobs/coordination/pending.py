"""Taking pending runs: priority order with aging, natively in SQL or ranked in Python.

A due pending run ranks ``priority + seconds overdue / PRIORITY_AGING``: highest first, then the
earliest due, then the oldest. The native paths order by the rank stored with each pending run
(:mod:`django_cluster_jobs.ranks`), which an index serves; the portable path ranks in Python.
Waiting PRIORITY_AGING seconds is worth one priority point, so a
low-priority run is eventually taken before fresh high-priority ones and cannot starve. A stored
priority outside ``PRIORITY_MIN``…``PRIORITY_MAX`` (written before it was validated) ranks as the
nearest bound, so no stored value can make the ranking overflow or fail for the other runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet

from ..bounds import PRIORITY_MAX, PRIORITY_MIN, REASON_MAX_LENGTH
from ..models import Cause, EventKind, JobRun, RunEvent, RunState
from ..ranks import aging_step, bounded
from ..stored import UnreadableRow, collecting, loads, tolerant
from . import sql
from .base import dt_param
from .types import Won

__all__ = [
    "BOUNDS", "aging_step", "bounded", "pick", "rank_key", "take_native", "take_returning",
    "taken_kind",
]  # fmt: skip

#: The bounds a priority ranks within, as the SQL orders spell them.
BOUNDS = {"low": PRIORITY_MIN, "high": PRIORITY_MAX}


def rank_key(
    aging: timedelta | None, now: datetime
) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """Return a sort key over (pk, due_at, priority) that puts runs in the order they are taken;
    plain float arithmetic, so no stored due time or priority can overflow it."""
    if aging is None:
        return lambda row: (-bounded(row[2]), row[1], row[0])
    return lambda row: (-(bounded(row[2]) + (now - row[1]) / aging), row[1], row[0])


def taken_kind(cause: str) -> str:
    """The timeline entry of a run being taken: a takeover when its previous owner went away."""
    released = cause in (Cause.LEASE_EXPIRED, Cause.HANDED_BACK, Cause.NODE_LOST)
    return EventKind.TAKEN_OVER if released else EventKind.STARTED


def won_of(run: JobRun) -> Won:
    """The Won of a run just taken."""
    return Won(run.pk, run.job_id, run.key, run.fence, run.attempt, run.scheduled_at, run.payload)


def take_native(
    cursor: Any,
    vendor: Any,
    node: str,
    job_ids: Collection[int],
    limit: int,
    now: datetime,
    lease_until: datetime,
) -> list[Won]:
    """Run TAKE_PENDING and its events on ``cursor`` (inside the vendor's write transaction),
    ordered by ``vendor.pending_order(now)`` and locked as ``vendor.features`` allow."""
    if not job_ids or limit < 1:
        return []
    conn = vendor.connection
    order, order_params = vendor.pending_order(now)
    lock = "FOR UPDATE SKIP LOCKED" if vendor.features.skip_locked else ""
    marks = ", ".join(["%s"] * len(job_ids))
    at = dt_param(conn, now)
    params = [node, dt_param(conn, lease_until), at, at, *job_ids, *order_params, limit]
    cursor.execute(sql.TAKE_PENDING.format(job_ids=marks, order=order, lock=lock), params)
    ids = [row[0] for row in cursor.fetchall()]
    if not ids:
        return []
    cursor.execute(sql.TAKEN_EVENTS.format(ids=", ".join(["%s"] * len(ids))), [at, *ids])
    with collecting() as unreadable:
        taken = tolerant(JobRun.objects.using(vendor.alias).filter(pk__in=ids))
        rows = {r.pk: r for r in taken}
    for row in unreadable:
        dead_letter_unreadable(vendor.alias, row, node, now)
    ranked = [(r.pk, r.due_at, r.priority) for r in rows.values()]
    return [won_of(rows[pk]) for pk, _, _ in sorted(ranked, key=rank_key(aging_step(), now))]


def dead_letter_unreadable(alias: str, row: UnreadableRow, node: str, now: datetime) -> None:
    """End a taken run that cannot be read, with its reason: no attempt could ever read it (a
    replay, once its row is corrected, runs it). In the take's transaction."""
    reason = str(row)[:10_000]
    JobRun.objects.using(alias).filter(pk=row.pk).update(
        state=RunState.DEAD, error=reason, reason=reason[:REASON_MAX_LENGTH], finished_at=now,
        lease_expires_at=None,
    )  # fmt: skip
    RunEvent.objects.using(alias).create(
        run_id=row.pk, at=now, kind=EventKind.DEAD_LETTERED, node=node, reason=reason
    )


def take_returning(
    cursor: Any,
    vendor: Any,
    node: str,
    job_ids: Collection[int],
    limit: int,
    now: datetime,
    lease_until: datetime,
) -> list[Won]:
    """Run PG_TAKE_PENDING on ``cursor``: the take, its events and the taken rows in one
    statement; return the runs taken in rank order."""
    if not job_ids or limit < 1:
        return []
    order, order_params = vendor.pending_order(now)
    marks = ", ".join(["%s"] * len(job_ids))
    query = sql.PG_TAKE_PENDING.format(job_ids=marks, order=order, lock="FOR UPDATE SKIP LOCKED")
    params = [node, lease_until, now, now, *job_ids, *order_params, limit, now]
    cursor.execute(query, params)
    rows = cursor.fetchall()
    rows.sort(key=lambda r: rank_key(aging_step(), now)((r[0], r[7], r[8])))
    return [Won(r[0], r[1], r[2], r[3], r[4], r[5], _json(r[6])) for r in rows]


def _json(value: Any) -> Any:
    """A JSON column as a raw query returns it: text on some drivers, parsed on others; JSON
    no decoder can follow is an Unreadable value (its run then fails with that reason)."""
    return loads(value) if isinstance(value, str | bytes) else value


def pick(
    due: QuerySet, limit: int, now: datetime, *, skip_locked: bool = False
) -> list[tuple[int, int, str, str]]:
    """Return (pk, fence, cause, reason) of the ``limit`` due runs TAKE_PENDING would take, in
    order.

    The portable path has no date arithmetic it can trust on every database, so it reads the
    ``limit`` earliest due runs of each priority present (the best ``limit`` by rank are among
    them) and ranks those in Python; with ``skip_locked`` it locks what it reads, skipping rows
    a racer holds.
    """
    fields = ("pk", "due_at", "priority", "fence", "cause", "reason")
    locked = due.select_for_update(skip_locked=True) if skip_locked else due
    if aging_step() is None:
        best = locked.order_by("-priority", "due_at", "pk").values_list(*fields)[:limit]
        return [(pk, fence, cause, reason) for pk, _, _, fence, cause, reason in best]
    candidates: list[tuple[Any, ...]] = []
    for priority in due.order_by().values_list("priority", flat=True).distinct():
        earliest = locked.filter(priority=priority).order_by("due_at", "pk")
        candidates += earliest.values_list(*fields)[:limit]
    candidates.sort(key=rank_key(aging_step(), now))
    return [(pk, fence, cause, reason) for pk, _, _, fence, cause, reason in candidates[:limit]]

"""Taking pending runs: priority order with aging, in SQL for the fast paths and in the ORM.

A due pending run ranks ``priority + seconds overdue / PRIORITY_AGING``: highest first, then the
earliest due, then the oldest. Waiting PRIORITY_AGING seconds is worth one priority point, so a
low-priority run is eventually taken before fresh high-priority ones and cannot starve. A stored
priority outside ``PRIORITY_MIN``…``PRIORITY_MAX`` (written before it was validated) ranks as the
nearest bound, so no stored value can make the ranking overflow or fail for the other runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

from ..conf import app_settings
from ..models import JobRun
from ..validation import PRIORITY_MAX, PRIORITY_MIN
from . import sql
from .base import Won, dt_param


def aging_step() -> timedelta | None:
    """Return the wait worth one priority point, or None when aging is off."""
    seconds = app_settings.PRIORITY_AGING
    if not seconds or seconds <= 0:
        return None
    return timedelta(seconds=seconds)


def bounded(priority: int) -> int:
    """The priority a run ranks with: its own, within PRIORITY_MIN…PRIORITY_MAX."""
    return max(PRIORITY_MIN, min(PRIORITY_MAX, priority))


def rank_key(
    aging: timedelta | None, now: datetime
) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """Return a sort key over (pk, due_at, priority) that puts runs in the order they are taken;
    plain float arithmetic, so no stored due time or priority can overflow it."""
    if aging is None:
        return lambda row: (-bounded(row[2]), row[1], row[0])
    return lambda row: (-(bounded(row[2]) + (now - row[1]) / aging), row[1], row[0])


def _sql_order(connection: Any, dialect: str, now: datetime) -> tuple[str, list[Any]]:
    """Return the ORDER BY of TAKE_PENDING for ``dialect`` ("postgresql" or "sqlite")."""
    aging, at = aging_step(), dt_param(connection, now)
    if aging is None:
        return sql.PRIORITY_ORDER, []
    bounds = {"low": PRIORITY_MIN, "high": PRIORITY_MAX}
    if dialect == "postgresql":
        seconds = Decimal(aging // timedelta(microseconds=1)) / 1_000_000
        return sql.PG_PENDING_ORDER.format(**bounds), [seconds, at]
    return sql.SQLITE_PENDING_ORDER.format(**bounds), [aging // timedelta(milliseconds=1), at]


def take_pending(
    cursor: Any,
    connection: Any,
    alias: str,
    node: str,
    job_ids: Collection[int],
    limit: int,
    now: datetime,
    lease_until: datetime,
    dialect: str,
) -> list[Won]:
    """Run TAKE_PENDING and its events on ``cursor`` (inside the caller's transaction).

    ``dialect`` is the calling coordinator's vendor ("postgresql" or "sqlite"): it picks the
    date arithmetic of the aging order and whether racers skip each other's locked rows.
    """
    lock = "FOR UPDATE SKIP LOCKED" if dialect == "postgresql" else ""
    if not job_ids or limit < 1:
        return []
    marks = ", ".join(["%s"] * len(job_ids))
    order, order_params = _sql_order(connection, dialect, now)
    at = dt_param(connection, now)
    params = [node, dt_param(connection, lease_until), at, at, *job_ids, *order_params, limit]
    cursor.execute(sql.TAKE_PENDING.format(job_ids=marks, order=order, lock=lock), params)
    ids = [row[0] for row in cursor.fetchall()]
    if not ids:
        return []
    cursor.execute(sql.TAKEN_EVENTS.format(ids=", ".join(["%s"] * len(ids))), [at, *ids])
    rows = {r.pk: r for r in JobRun.objects.using(alias).filter(pk__in=ids)}
    ranked = [(r.pk, r.due_at, r.priority) for r in rows.values()]
    return [won_of(rows[pk]) for pk, _, _ in sorted(ranked, key=rank_key(aging_step(), now))]


def won_of(run: JobRun) -> Won:
    """The Won of a run just taken."""
    return Won(run.pk, run.job_id, run.key, run.fence, run.attempt, run.scheduled_at, run.payload)


class SQLPendingMixin:
    """``claim_pending`` through TAKE_PENDING for the coordinators with native SQL.

    The class provides ``write_cursor()``: a cursor inside the write transaction its database
    needs (PostgreSQL: a plain transaction, rows locked as taken; SQLite: the writer lock first).
    """

    alias: str
    vendor: str
    connection: Any

    def write_cursor(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def claim_pending(
        self, node: str, job_ids: Collection[int], limit: int, now: datetime, lease_until: datetime
    ) -> list[Won]:
        with self.write_cursor() as cursor:
            return take_pending(
                cursor,
                self.connection,
                self.alias,
                node,
                job_ids,
                limit,
                now,
                lease_until,
                self.vendor,
            )


def pick(
    due: QuerySet, limit: int, now: datetime, *, skip_locked: bool = False
) -> list[tuple[int, int, str]]:
    """Return (pk, fence, reason) of the ``limit`` due runs TAKE_PENDING would take, in order.

    The portable path has no date arithmetic it can trust on every database, so it reads the
    ``limit`` earliest due runs of each priority present (the best ``limit`` by rank are among
    them) and ranks those in Python; with ``skip_locked`` it locks what it reads, skipping rows
    a racer holds.
    """
    fields = ("pk", "due_at", "priority", "fence", "reason")
    locked = due.select_for_update(skip_locked=True) if skip_locked else due
    if aging_step() is None:
        best = locked.order_by("-priority", "due_at", "pk").values_list(*fields)[:limit]
        return [(pk, fence, reason) for pk, _, _, fence, reason in best]
    candidates = []
    for priority in due.order_by().values_list("priority", flat=True).distinct():
        earliest = locked.filter(priority=priority).order_by("due_at", "pk")
        candidates += earliest.values_list(*fields)[:limit]
    candidates.sort(key=rank_key(aging_step(), now))
    return [(pk, fence, reason) for pk, _, _, fence, reason in candidates[:limit]]

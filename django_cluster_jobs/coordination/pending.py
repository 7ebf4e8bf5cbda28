"""Taking pending runs: priority order with aging, in SQL for the fast paths and in the ORM.

A due pending run ranks ``priority + seconds overdue / PRIORITY_AGING``: highest first, then the
earliest due, then the oldest. Waiting PRIORITY_AGING seconds is worth one priority point, so a
low-priority run is eventually taken before fresh high-priority ones and cannot starve. For a
given ``now`` the rank orders runs exactly like ``due_at - priority * PRIORITY_AGING`` ascending
(an "effective due time"), which is what the portable ORM path and the Python sort compute.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Case, DateTimeField, F, QuerySet, Value, When

from ..conf import app_settings
from ..models import JobRun
from . import sql
from .base import Won, dt_param


def aging_step() -> timedelta | None:
    """Return the wait worth one priority point, or None when aging is off."""
    seconds = app_settings.PRIORITY_AGING
    if not seconds or seconds <= 0:
        return None
    return timedelta(seconds=seconds)


def rank_key(aging: timedelta | None) -> Callable[[JobRun], tuple[Any, ...]]:
    """Return a sort key that puts runs in the order they are taken."""
    if aging is None:
        return lambda run: (-run.priority, run.due_at, run.pk)
    return lambda run: (run.due_at - aging * run.priority, run.due_at, run.pk)


def _sql_order(connection: Any, dialect: str, now: datetime) -> tuple[str, list[Any]]:
    """Return the ORDER BY of TAKE_PENDING for ``dialect`` ("postgresql" or "sqlite")."""
    aging, at = aging_step(), dt_param(connection, now)
    if aging is None:
        return sql.PRIORITY_ORDER, []
    if dialect == "postgresql":
        seconds = Decimal(aging // timedelta(microseconds=1)) / 1_000_000
        return sql.PG_PENDING_ORDER, [seconds, at]
    return sql.SQLITE_PENDING_ORDER, [aging // timedelta(milliseconds=1), at]


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
    rows = sorted(JobRun.objects.using(alias).filter(pk__in=ids), key=rank_key(aging_step()))
    return [Won(r.pk, r.job_id, r.key, r.fence, r.attempt, r.scheduled_at, r.payload) for r in rows]


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


def ranked(due: QuerySet) -> QuerySet:
    """Order due pending runs as TAKE_PENDING does, with portable ORM expressions.

    Each priority present becomes one ``WHEN priority = p THEN due_at - p * aging`` branch:
    datetime minus a constant duration works on every database Django supports, where an integer
    column times a duration does not. A priority that appears after the branches were read (a run
    enqueued meanwhile) ranks last this time and normally at the next look.
    """
    aging = aging_step()
    if aging is None:
        return due.order_by("-priority", "due_at", "pk")
    priorities = sorted(set(due.order_by().values_list("priority", flat=True).distinct()))
    if not priorities:
        return due.order_by("due_at", "pk")
    effective_due = Case(
        *(When(priority=p, then=F("due_at") - Value(aging * p)) for p in priorities),
        output_field=DateTimeField(),
    )
    return due.order_by(effective_due.asc(nulls_last=True), "due_at", "pk")

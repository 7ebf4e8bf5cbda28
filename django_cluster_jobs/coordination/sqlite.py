"""SQLite: the batch claim under the single writer lock, taken up front with BEGIN IMMEDIATE."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any

from . import sql
from .base import Claim, Coordinator, Won, dt_param, json_param
from .pending import SQLPendingMixin


@contextmanager
def immediate(connection: Any) -> Iterator[Any]:
    """Run in a write transaction taken up front, or inside the caller's open transaction."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        if connection.in_atomic_block:
            yield cursor
            return
        cursor.execute("BEGIN IMMEDIATE")
        try:
            yield cursor
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")


class SQLiteCoordinator(SQLPendingMixin, Coordinator):
    """``INSERT … ON CONFLICT DO NOTHING RETURNING`` (SQLite ≥ 3.35) in one write transaction."""

    vendor = "sqlite"
    #: SQLite runs inside this process: its clock is the host's, which every node shares.
    clock_is_local = True

    def db_now(self) -> datetime:
        # What SQLite's own clock would answer, to the microsecond instead of the millisecond.
        return datetime.now(UTC)

    def claim(
        self, claims: Sequence[Claim], node: str, now: datetime, lease_until: datetime
    ) -> list[Won]:
        if not claims:
            return []
        conn = self.connection
        at, lease = dt_param(conn, now), dt_param(conn, lease_until)
        params: list[object] = []
        for c in claims:
            params += [
                c.job_id,
                c.key,
                dt_param(conn, c.scheduled_at),
                c.outcome,
                c.priority,
                json_param(conn, c.payload),
                c.slot,
                c.revision,
            ]
        params += [node, lease, at, at, at]
        query = sql.SQLITE_CLAIM.format(rows=", ".join([sql.CLAIM_ROW] * len(claims)))
        # "database is locked" after the busy timeout propagates: the node records the claim as
        # failed and skips the occurrence (fail-closed) instead of guessing who won.
        with immediate(conn) as cursor:
            cursor.execute(query, params)
            won = [Won(run_id, job_id, key) for run_id, job_id, key in cursor.fetchall()]
            cursor.executemany(sql.CLAIMED_EVENT, [(w.run_id, at, node) for w in won])
        return won

    def write_cursor(self) -> AbstractContextManager[Any]:
        return immediate(self.connection)

"""SQLite: the batch claim under the single writer lock, taken up front with BEGIN IMMEDIATE."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from django.db import transaction

from ..ranks import ensure_ranked, rank_of
from . import sql, wakefile
from .base import Features, dt_param, json_param
from .inserts import Clock, insert_pending, stored
from .orm import ORMVendor
from .pending import aging_step, take_native
from .types import (
    Claim,
    Heartbeat,
    LeaderRenewal,
    NodeStats,
    Won,
    instant,
    lease_seen,
    peers_of,
)

logger = logging.getLogger(__name__)


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


class SQLiteVendor(ORMVendor):
    """``INSERT … ON CONFLICT DO NOTHING RETURNING`` (SQLite ≥ 3.35) in one write transaction
    taken up front; the writer lock serialises everything else."""

    name = "sqlite"
    #: SQLite runs inside this process: its clock is the host's, which every node shares.
    features: ClassVar[Features] = Features(
        returning=True, clock_is_local=True, inserts_pending=True
    )

    def db_now(self) -> datetime:
        # What SQLite's own clock would answer, to the microsecond instead of the millisecond.
        return datetime.now(UTC)

    def insert_pending(
        self, run: Any, name: str, callable_name: str, priority: int | None
    ) -> Any:
        conn, now = self.connection, self.db_now()
        due = now if run.due_at is None else run.due_at
        clock = Clock(
            now="%s", due="%s", due_us="%s", now_params=(dt_param(conn, now),),
            due_params=(dt_param(conn, due),), due_us_params=(rank_of(due, 0, 0),),
        )  # fmt: skip
        query, params = insert_pending(conn, run, name, callable_name, priority, clock)
        with conn.cursor() as cursor:
            cursor.execute(query, params)
            row = cursor.fetchone()
        if row is None:
            return None
        # The wake file is signalled once the run is committed (at once outside a transaction).
        transaction.on_commit(partial(self.notify_pending, 1), using=self.alias)
        run.scheduled_at, run.due_at, run.created_at = due, due, now
        return stored(run, row, self.alias, times=False)

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

    def heartbeat(
        self,
        node: str,
        now: datetime,
        lease_until: datetime,
        stats: NodeStats,
        runs: Collection[tuple[int, int]] = (),
        leader: LeaderRenewal | None = None,
    ) -> Heartbeat:
        """One statement for the node row (its status and what every heartbeat reads back), one
        for the leases of its runs when it executes any, one for the leader lease on the leader;
        each commits on its own (a transaction around them would add two statements a beat)."""
        conn = self.connection
        at = dt_param(conn, now)
        params = [at, stats.clock_offset_ms, stats.claims_won, stats.claims_lost,
                  json_param(conn, stats.skipped), node]  # fmt: skip
        pairs = [(int(run_id), int(fence)) for run_id, fence in runs]
        fence = None
        with conn.cursor() as cursor:
            cursor.execute(sql.SQLITE_HEARTBEAT, params)
            row = cursor.fetchone()
            owned: list[tuple[int, bool]] = []
            if pairs:
                renew = sql.SQLITE_RENEW.format(pairs=", ".join(["(%s, %s)"] * len(pairs)))
                flat = [value for pair in pairs for value in pair]
                cursor.execute(renew, [dt_param(conn, lease_until), node, *flat])
                owned = [(run_id, bool(cancel)) for run_id, cancel in cursor.fetchall()]
            if leader is not None:
                cursor.execute(sql.LEADER_RENEW, [dt_param(conn, leader.until), leader.token, at])
                renewed = cursor.fetchone()
                fence = renewed[0] if renewed else None
        status, definitions, peers, lease, expiry = row if row else ("", None, None, None, None)
        return Heartbeat.of(
            status,
            owned,
            definitions=definitions,
            peers=peers_of(peers),
            leader_fence=fence,
            leader=lease_seen(lease),
            next_expiry=instant(expiry),
        )

    def wake_path(self) -> Path | None:
        return wakefile.path_for(self.connection.settings_dict["NAME"])

    def notify_pending(self, count: int | None = None) -> None:
        """Wake the idle nodes through the wake file beside the database (every process that
        opens an SQLite file runs on its host); a failure is logged, never raised: the run is
        committed, and the nodes' safety poll finds it."""
        path = self.wake_path()
        if path is None:
            return
        try:
            wakefile.signal(path)
        except OSError as exc:
            logger.warning(
                "could not wake the idle nodes through %s (%s); they find the new run at their "
                "next poll: let every process that uses the database write to its directory",
                path, exc,
            )  # fmt: skip

    def take_pending(
        self, node: str, job_ids: Collection[int], limit: int, now: datetime, lease_until: datetime
    ) -> list[Won]:
        ensure_ranked(self.alias)
        with immediate(self.connection) as cursor:
            return take_native(cursor, self, node, job_ids, limit, now, lease_until)

    def pending_order(self, now: datetime) -> tuple[str, list[Any]]:
        """TAKE_PENDING's ORDER BY: the stored rank, or strict priority without aging."""
        return (sql.PRIORITY_ORDER if aging_step() is None else sql.RANK_ORDER), []

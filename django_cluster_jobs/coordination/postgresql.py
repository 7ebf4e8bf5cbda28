"""PostgreSQL: batch claims and heartbeats in one round trip, advisory locks for window claims."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, ClassVar

from django.db import transaction

from ..ranks import ensure_ranked
from . import sql
from .base import Features, json_param
from .inserts import Clock, insert_pending, stored
from .orm import ORMVendor
from .pending import aging_step, take_returning
from .types import (
    Claim,
    Ending,
    Heartbeat,
    LeaderRenewal,
    NodeStats,
    Won,
    instant,
    lease_seen,
    peers_of,
)

#: First key of the two-int advisory lock space, so ours cannot collide with the application's
#: single-bigint locks ("CJ" in ASCII).
ADVISORY_CLASS = 0x434A
#: LISTEN/NOTIFY channel on which idle nodes hear that a run became pending.
PENDING_CHANNEL = "cluster_jobs_pending"


#: How the one-statement enqueue reads cluster time: the statement's own clock.
CLOCK_SQL = "statement_timestamp()"
#: A run's due time in whole microseconds since 1970 (EXTRACT returns an exact numeric).
DUE_US = "CAST(EXTRACT(EPOCH FROM v.due) * 1000000 AS BIGINT)"

# The one-statement enqueue (inserts.INSERT_PENDING) and its notification: the payload counts
# the runs made pending (engine.wakeups). Parameters: the insert's, the channel, the payload.
PG_INSERT_PENDING = """
WITH new AS ({insert})
SELECT new.id, new.job_id, new.priority, new.due_at, new.created_at, new.pending_rank,
       pg_notify(%s, %s)
FROM new
"""


#: Batches up to this size are sent as VALUES rows, larger ones as one JSON document: for one
#: occurrence VALUES is ~0.3 ms faster, from about 5 on they are even, and at 1000 the document
#: saves a fifth of the time (measured with bench/claims.py's setup; see bench/RESULTS.md).
VALUES_LIMIT = 8


def _record(c: Claim) -> dict[str, object]:
    """One occurrence as an object of CLAIM_RECORDS' document."""
    return {
        "job_id": c.job_id,
        "key": c.key,
        "scheduled_at": c.scheduled_at.isoformat(),
        "outcome": c.outcome,
        "priority": c.priority,
        "payload": c.payload,
        "slot": c.slot,
        "revision": c.revision,
    }


class PostgreSQLVendor(ORMVendor):
    """``INSERT … ON CONFLICT DO NOTHING RETURNING``, one-statement heartbeats, ``FOR UPDATE SKIP
    LOCKED`` takes, ``pg_advisory_xact_lock`` for gated claims, LISTEN/NOTIFY."""

    name = "postgresql"
    features: ClassVar[Features] = Features(
        listens=True, skip_locked=True, returning=True, no_key_locks=True, session_locks=True,
        inserts_pending=True,
    )

    def claim(
        self, claims: Sequence[Claim], node: str, now: datetime, lease_until: datetime
    ) -> list[Won]:
        if not claims:
            return []
        if len(claims) <= VALUES_LIMIT:
            query = sql.PG_CLAIM.format(rows=", ".join([sql.CLAIM_ROW] * len(claims)))
            params = []
            for c in claims:
                payload = json_param(self.connection, c.payload)
                params += [c.job_id, c.key, c.scheduled_at, c.outcome, c.priority, payload]
                params += [c.slot, c.revision]
        else:
            query = sql.PG_CLAIM_RECORDS
            params = [json.dumps([_record(c) for c in claims])]
        params += [node, lease_until, now, now, now, now, node]
        with self.connection.cursor() as cursor:
            cursor.execute(query, params)
            return [Won(run_id, job_id, key) for run_id, job_id, key in cursor.fetchall()]

    def take_pending(
        self, node: str, job_ids: Collection[int], limit: int, now: datetime, lease_until: datetime
    ) -> list[Won]:
        ensure_ranked(self.alias)
        with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
            return take_returning(cursor, self, node, job_ids, limit, now, lease_until)

    def pending_order(self, now: datetime) -> tuple[str, list[Any]]:
        """TAKE_PENDING's ORDER BY: the stored rank, or strict priority without aging."""
        return (sql.PRIORITY_ORDER if aging_step() is None else sql.RANK_ORDER), []

    def finish(self, won: Won, node: str, state: str, now: datetime, ending: Ending) -> bool:
        result = None if ending.result is None else json_param(self.connection, ending.result)
        params = [state, now, result, ending.error, ending.traceback, won.run_id, won.fence]
        params += [won.run_id, now, state, node, won.fence, ending.reason, ending.fenced_reason]
        with self.connection.cursor() as cursor:
            cursor.execute(sql.PG_FINISH, params)
            return bool(cursor.fetchone()[0])

    def estimated_rows(self, table: str) -> int | None:
        with self.connection.cursor() as cursor:
            cursor.execute(sql.ROW_ESTIMATE, [table])
            row = cursor.fetchone()
        # reltuples is -1 until the table is first vacuumed or analysed (PostgreSQL 14+).
        return int(row[0]) if row is not None and row[0] >= 0 else None

    def begin_effects(self, won: Won, seconds: float | None) -> bool:
        if seconds:
            # The transaction's own bounds: a statement, and a session that stopped talking
            # (a frozen node), end at the job's timeout; both reset when the transaction ends.
            bound = f"{max(1, round(seconds * 1000))}ms"
            with self.connection.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, true), "
                               "set_config('idle_in_transaction_session_timeout', %s, true)",
                               [bound, bound])  # fmt: skip
        return super().begin_effects(won, seconds)

    def insert_pending(
        self, run: Any, name: str, callable_name: str, priority: int | None
    ) -> Any:
        due = f"COALESCE(%s, {CLOCK_SQL})"
        clock = Clock(now=CLOCK_SQL, due=due, due_us=DUE_US, due_params=(run.due_at,))
        insert, params = insert_pending(self.connection, run, name, callable_name, priority, clock)
        with self.connection.cursor() as cursor:
            cursor.execute(PG_INSERT_PENDING.format(insert=insert.strip()),
                           [*params, PENDING_CHANNEL, "1"])  # fmt: skip
            row = cursor.fetchone()
        return None if row is None else stored(run, row, self.alias)

    def notify_pending(self, count: int | None = None) -> None:
        self.notify_payload("" if count is None else str(count))

    def notify_payload(self, payload: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [PENDING_CHANNEL, payload])

    def bound_lock_waits(self, seconds: float) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{seconds * 1000:.0f}"])

    def lock_job(self, job_id: int) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [ADVISORY_CLASS, job_id])

    def lock_queue(self, queue: str) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [ADVISORY_CLASS + 1, queue]
            )

    def heartbeat(
        self,
        node: str,
        now: datetime,
        lease_until: datetime,
        stats: NodeStats,
        runs: Collection[tuple[int, int]] = (),
        leader: LeaderRenewal | None = None,
    ) -> Heartbeat:
        conn = self.connection
        pairs = [(int(run_id), int(fence)) for run_id, fence in runs]
        params = [
            now,
            stats.clock_offset_ms,
            stats.claims_won,
            stats.claims_lost,
            json_param(conn, stats.skipped),
            node,
            lease_until,
            node,
            [run_id for run_id, _ in pairs],
            [fence for _, fence in pairs],
            leader.until if leader else now,
            leader.token if leader else None,
            now,
        ]
        with conn.cursor() as cursor:
            cursor.execute(sql.PG_HEARTBEAT, params)
            rows = cursor.fetchall()
        owned = [(row[1], row[2]) for row in rows if row[1] is not None]
        first = rows[0]
        return Heartbeat.of(
            first[0],
            owned,
            db_time=first[3],
            leader_fence=first[4],
            definitions=first[5],
            peers=peers_of(first[6]),
            leader=lease_seen(first[7]),
            next_expiry=instant(first[8]),
        )

"""The vendor layer's interface: what differs between databases, and nothing else.

A vendor answers the hot statements of the protocol (claim a batch of occurrences, heartbeat,
take pending runs), the locks that serialize gated claims, the notification that wakes idle
nodes, the bound on lock waits and the database's clock. Everything else is written once, over
the ORM, in :mod:`django_cluster_jobs.ledger`. Each vendor declares what its database can do
with :class:`Features`, in the style of Django's ``DatabaseFeatures``; shared code reads those
flags, never ``connection.vendor`` (only :func:`django_cluster_jobs.coordination.vendor_of` does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from django.db import IntegrityError, connections, transaction
from django.db.models import QuerySet

from ..models import Lease
from . import sql
from .types import Claim, Ending, Heartbeat, LeaderRenewal, NodeStats, Won


@dataclass(frozen=True)
class Features:
    """What a vendor's database can do, as the protocol uses it."""

    #: Idle nodes are woken by notifications (LISTEN/NOTIFY) instead of polling for pending runs.
    listens: bool = False
    #: Racers skip each other's locked rows (FOR UPDATE SKIP LOCKED) when taking pending runs.
    skip_locked: bool = False
    #: INSERT … RETURNING claims a whole batch in one statement.
    returning: bool = False
    #: The database's clock is this host's (SQLite runs in the process): offsets are exact.
    clock_is_local: bool = False
    #: Row locks that do not block foreign-key checks (FOR NO KEY UPDATE).
    no_key_locks: bool = False
    #: Session advisory locks, released by the server when the session ends: a node's death is
    #: an event a peer waits for (engine.presence). Where the clock is local instead, every node
    #: shares the host and a peer looks at the process itself.
    session_locks: bool = False
    #: A one-off run is stored by one INSERT that reads its job's definition row itself
    #: (coordination.inserts), the pending notification included where the database notifies.
    inserts_pending: bool = False


class Vendor(ABC):
    """The statements one database answers its own way; ``alias`` names it in DATABASES."""

    name: ClassVar[str]
    features: ClassVar[Features]

    def __init__(self, alias: str) -> None:
        self.alias = alias

    @property
    def connection(self) -> Any:
        return connections[self.alias]

    @abstractmethod
    def claim(
        self, claims: Sequence[Claim], node: str, now: datetime, lease_until: datetime
    ) -> list[Won]:
        """Insert a running run per claim its gate lets through; return exactly those won."""

    @abstractmethod
    def heartbeat(
        self,
        node: str,
        now: datetime,
        lease_until: datetime,
        stats: NodeStats,
        runs: Collection[tuple[int, int]] = (),
        leader: LeaderRenewal | None = None,
    ) -> Heartbeat:
        """Renew the node row, the leases of ``runs`` ((run id, fence) pairs it executes) and,
        with ``leader``, the leader lease this node holds; the answer's ``owned_runs`` are the
        ones the database confirmed under their fence. Reads what the answer carries besides
        (see Heartbeat) in the same round trip where the database can."""

    @abstractmethod
    def take_pending(
        self, node: str, job_ids: Collection[int], limit: int, now: datetime, lease_until: datetime
    ) -> list[Won]:
        """Take up to ``limit`` due pending runs of ``job_ids``, by priority with aging."""

    @abstractmethod
    def lock_job(self, job_id: int) -> None:
        """Serialise gated and window claims of one job until the transaction ends."""

    @abstractmethod
    def lock_queue(self, queue: str) -> None:
        """Serialise gated claims of one queue until the transaction ends."""

    @abstractmethod
    def db_now(self) -> datetime:
        """Return the database's current time (aware): cluster time."""

    def finish(self, won: Won, node: str, state: str, now: datetime, ending: Ending) -> bool | None:
        """Write a run's end and its timeline entry in one statement where the database can;
        return whether it was written under the fence, or None to use the portable path."""
        return None

    def begin_effects(self, won: Won, seconds: float | None) -> bool:
        """Open an exactly-once run's transaction (the caller's ``atomic`` block): bound it to
        ``seconds`` on the server where the database can, and check that this node still holds
        the run's fence (False: it does not, and the handler must not run). Portable path:
        check the fence; a database that bounds statements per session is restored by
        :meth:`end_effects`."""
        runs = self.connection.ops.quote_name(sql.RUN)
        with self.connection.cursor() as cursor:
            if self.connection.vendor == "sqlite":
                # The writer lock up front (the handler will write): a transaction that read
                # first could not write later, once another connection had written.
                cursor.execute(f"UPDATE {runs} SET fence = fence WHERE id = %s AND fence = %s "
                               "AND state = 'running'", [won.run_id, won.fence])  # fmt: skip
                return cursor.rowcount == 1
            if getattr(self.connection, "mysql_is_mariadb", False) and seconds:
                # A statement, and a transaction left idle (a frozen node), end at the job's
                # timeout. (MySQL has neither variable: its server's own timeouts apply.)
                cursor.execute("SET SESSION max_statement_time = %s, "
                               "idle_transaction_timeout = %s",
                               [seconds, max(1, round(seconds))])  # fmt: skip
            cursor.execute(f"SELECT 1 FROM {runs} WHERE id = %s AND fence = %s "
                           "AND state = 'running'", [won.run_id, won.fence])  # fmt: skip
            return cursor.fetchone() is not None

    def end_effects(self) -> None:
        """Restore what :meth:`begin_effects` set for the session (after the transaction)."""
        if getattr(self.connection, "mysql_is_mariadb", False):
            with self.connection.cursor() as cursor:
                cursor.execute("SET SESSION max_statement_time = DEFAULT, "
                               "idle_transaction_timeout = DEFAULT")  # fmt: skip

    def estimated_rows(self, table: str) -> int | None:
        """Return the planner's estimate of the rows in ``table`` (a name from a model's
        ``_meta``) where the database keeps one, so a large list need not count them; None
        where it keeps none, or has not measured the table yet."""
        return None

    def insert_pending(
        self, run: Any, name: str, callable_name: str, priority: int | None
    ) -> Any:
        """Store ``run`` (a JobRun without its job, priority and times) as a pending run of job
        ``name`` while its definition still names ``callable_name``; return it stored, or None
        when no such definition exists. Only where ``features.inserts_pending``."""
        raise NotImplementedError(f"{self.name} stores runs through the ORM")

    def notify_pending(self, count: int | None = None) -> None:  # noqa: B027 - most cannot notify
        """Wake idle nodes because ``count`` runs became pending (None: an unknown number, which
        wakes every node), where the database notifies."""

    def notify_payload(self, payload: str) -> None:  # noqa: B027 - most databases cannot notify
        """Send the pending notification with ``payload`` (engine.wakeups: a wake-up passed on
        by a node), where the database notifies."""

    def wake_path(self) -> Path | None:
        """The file through which :meth:`notify_pending` wakes idle nodes on this host, where
        the database cannot notify (:mod:`.wakefile`); None where it can, or nothing can."""
        return None

    def bound_lock_waits(self, seconds: float) -> None:  # noqa: B027 - a no-op where unbounded
        """Make the current transaction's statements give up after waiting ``seconds`` for a
        row lock, where the database can (elsewhere its own busy timeout applies)."""


def json_param(connection: Any, value: Any) -> Any:
    """Adapt a JSON value for a raw query on this connection."""
    return connection.ops.adapt_json_value(value, None)


def dt_param(connection: Any, value: datetime | None) -> Any:
    """Adapt an aware datetime for a raw query on this connection."""
    return connection.ops.adapt_datetimefield_value(value)


#: SQLite's primary result codes for a lock it waited on in vain (SQLITE_BUSY, SQLITE_LOCKED).
SQLITE_LOCK_CODES = frozenset({5, 6})
#: PostgreSQL's SQLSTATE for a lock not granted within lock_timeout (lock_not_available).
PG_LOCK_NOT_AVAILABLE = "55P03"


def is_lock_timeout(exc: BaseException) -> bool:
    """True when a statement gave up waiting for a lock (SQLite's busy timeout, PostgreSQL's
    lock_timeout): a lost race, not a crash. Read from the driver's error code, not its text."""
    cause = exc.__cause__ or exc
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in SQLITE_LOCK_CODES
    return getattr(cause, "sqlstate", None) == PG_LOCK_NOT_AVAILABLE


#: (alias, name) of lease rows known to exist, so a renewal or a lock skips the existence check.
_LEASE_ROWS: set[tuple[str, str]] = set()


def lease_row(alias: str, name: str, *, recheck: bool = False) -> QuerySet[Lease]:
    """The lease row ``name`` (the leader's, a cluster lock's, a queue's lock), created on first
    use; ``recheck`` after finding it gone (an operator deleted it) creates it again."""
    rows = Lease.objects.using(alias).filter(name=name)
    if recheck:
        _LEASE_ROWS.discard((alias, name))
    if (alias, name) not in _LEASE_ROWS:
        if not rows.exists():
            try:
                with transaction.atomic(using=alias):
                    Lease.objects.using(alias).create(name=name)
            except IntegrityError:
                pass  # created by a racer: fine
        _LEASE_ROWS.add((alias, name))
    return rows

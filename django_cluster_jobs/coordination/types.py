"""The values that cross the vendor layer: claims, runs won, heartbeats, gates and their answers."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class Refusal(StrEnum):
    """Why a claim inserted nothing, when another node did not win it (a skip counter too)."""

    DISABLED = "disabled"
    PAUSED = "paused"
    SETTLED = "settled"  # the job's mark already decided the occurrence
    CHANGED = "changed"  # planned from an older revision of the definition
    OVERLAP = "overlap"  # a live run of a no-overlap job holds its lane
    CONCURRENCY = "max_concurrency"
    QUEUE_LIMIT = "queue_limit"


@dataclass(frozen=True)
class Claim:
    """One occurrence this node wants to run."""

    job_id: int
    key: str
    scheduled_at: datetime
    outcome: str = "won"
    priority: int = 0
    payload: dict = field(default_factory=dict)
    #: True for an occurrence of the job's schedule (a slot): refused at or before the job's
    #: ``settled_through`` mark, in a pause, or when planned from another ``revision`` of the
    #: definition than the stored one. Startup, window and explicitly keyed external claims are not.
    slot: bool = False
    revision: int = 0


@dataclass(frozen=True)
class Won:
    """A claim this node won: the run row it now owns, under ``fence``."""

    run_id: int
    job_id: int
    key: str
    fence: int = 1
    attempt: int = 1
    scheduled_at: datetime | None = None
    payload: dict | None = None


@dataclass(frozen=True)
class WindowResult:
    """The answer to a fixed-delay window claim: the run won, or when to ask again."""

    won: Won | None = None
    next_check: datetime | None = None


@dataclass(frozen=True)
class NodeStats:
    """What a node reports at each heartbeat."""

    clock_offset_ms: float = 0.0
    claims_won: int = 0
    claims_lost: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        return {
            "clock_offset_ms": self.clock_offset_ms,
            "claims_won": self.claims_won,
            "claims_lost": self.claims_lost,
            "skipped": dict(self.skipped),
        }


@dataclass(frozen=True)
class Peer:
    """A live node as a heartbeat sees it: its registry row, id, process identity and last
    heartbeat (cluster time)."""

    pk: int
    node_id: str
    process: str
    last_heartbeat: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class LeaderRenewal:
    """What a heartbeat of the leader renews: its lease, under its token, until ``until``."""

    token: str
    until: datetime


@dataclass(frozen=True)
class LeaseSeen:
    """The leader lease as a heartbeat read it: who holds it, until when."""

    holder: str
    expires_at: datetime | None

    def free(self, now: datetime) -> bool:
        return self.expires_at is None or self.expires_at <= now


def _json(value: Any) -> Any:
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def instant(value: Any) -> datetime | None:
    """An aware datetime from a database value or JSON text (naive text is UTC, as Django stores
    it on SQLite); None from anything else."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def peers_of(rows: Any) -> tuple[Peer, ...]:
    """Peers from the ``[[pk, node_id, process, last_heartbeat], ...]`` a heartbeat statement
    returns (a JSON text on SQLite, already decoded on PostgreSQL); nothing from anything else."""
    rows = _json(rows)
    if not isinstance(rows, list):
        return ()
    return tuple(
        Peer(int(row[0]), str(row[1]), str(row[2] or ""), instant(row[3]))
        for row in rows
        if isinstance(row, list) and len(row) == 4 and isinstance(row[0], int)
    )


def lease_seen(value: Any) -> LeaseSeen | None:
    """The leader lease from the ``[holder, expires_at]`` a heartbeat statement returns."""
    value = _json(value)
    if not isinstance(value, list) or len(value) != 2:
        return None
    return LeaseSeen(str(value[0] or ""), instant(value[1]))


@dataclass(frozen=True)
class Heartbeat:
    """What a heartbeat learned: the node's status as stored, the runs it still owns, the
    definitions counter, and the database's clock when the statement could read it (PostgreSQL)
    at no extra cost."""

    status: str
    owned_runs: frozenset[int]
    cancel_requested: frozenset[int] = frozenset()
    db_time: datetime | None = None
    #: The definitions counter (models.Counter), read by the same statement; None when absent.
    definitions: int | None = None
    #: The live nodes (active or draining), this one included, where the statement reads them.
    peers: tuple[Peer, ...] = ()
    #: The leader lease's fence when this beat renewed it (the node holds it), else None.
    leader_fence: int | None = None
    #: The leader lease as the beat read it (before its own renewal); None without a row.
    leader: LeaseSeen | None = None
    #: The earliest lease expiry of a running run anywhere in the cluster.
    next_expiry: datetime | None = None

    @classmethod
    def of(
        cls,
        status: str | None,
        owned: Iterable[tuple[int, bool]],
        **read: Any,
    ) -> Heartbeat:
        """Build it from the ``(run id, cancel requested)`` pairs of the runs still owned and
        what else the statement read (the other fields, by name)."""
        owned = list(owned)
        return cls(
            status or "",
            frozenset(run_id for run_id, _ in owned),
            frozenset(run_id for run_id, cancel in owned if cancel),
            **read,
        )


@dataclass(frozen=True)
class GateResult:
    """What a gated claim did: won, buffered, or refused (with the skip row's reason)."""

    won: Won | None = None
    buffered: bool = False
    refusal: Refusal | None = None
    reason: str = ""
    cancelled: tuple[int, ...] = ()


@dataclass(frozen=True)
class GateState:
    """A job's claim gate as the database has it: why a claim of one of its occurrences failed."""

    enabled: bool
    paused_until: datetime | None
    settled_through: datetime
    revision: int = 0
    live_key: str | None = None

    def refusal(self, claim: Claim, now: datetime) -> Refusal | None:
        """Return why the gate refused ``claim``, or None when another node won it."""
        if not self.enabled:
            return Refusal.DISABLED
        until = self.paused_until
        if until is not None and (until > now or (claim.slot and claim.scheduled_at < until)):
            return Refusal.PAUSED
        if claim.slot and claim.revision != self.revision:
            return Refusal.CHANGED
        if claim.slot and claim.scheduled_at <= self.settled_through:
            return Refusal.SETTLED
        if self.live_key is not None and self.live_key != claim.key:
            return Refusal.OVERLAP
        return None


@dataclass(frozen=True)
class Ending:
    """What a run's end writes: its result, error and traceback, and the timeline's reasons."""

    result: Any
    error: str
    traceback: str
    #: The timeline entry's reason when the end is written, and when it is fenced out.
    reason: str
    fenced_reason: str

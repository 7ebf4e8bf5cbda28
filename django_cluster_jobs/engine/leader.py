"""The leader: one fenced lease; its holder alone reaps leases, buries dead nodes, purges and
settles missed occurrences, on a thread of its own so no chore delays a heartbeat."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from django.db import transaction

from ..conf import app_settings
from ..ledger import leases
from ..models import LEADER_LEASE, ClusterEvent, ClusterEventKind
from .catchup import catch_up
from .clockcheck import MAY_LEAD, ClockCheck
from .periodic import PeriodicThread
from .protocols import LeaderHost

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between two purges of the ledger by the same leader.
PURGE_EVERY = 60.0


class Leader:
    """Acquires or renews the leader lease at each beat and, while held, does the chores."""

    def __init__(self, host: LeaderHost) -> None:
        self.node = host
        self.token = uuid.uuid4().hex
        self.held: leases.Held | None = None
        self._last_purge: datetime | None = None
        #: On SQLite, where each node's clock is its own, whether it agrees with the others'.
        self._clock = ClockCheck(host.ledger.alias, host.node_id)
        self._verdict = MAY_LEAD

    @property
    def alias(self) -> str:
        return self.node.ledger.alias

    def beat(self) -> None:
        """Take or keep the lease; log and record every change of leader; do the chores."""
        now = self.node.clock.now()
        if self._refuses(now):
            return
        ttl = timedelta(seconds=app_settings.LEADER_TTL)
        # One transaction: a change of leader and its record are committed together.
        with transaction.atomic(using=self.alias):
            self._bound_lock_waits()
            node_id, previous = self.node.node_id, self.held
            held = leases.acquire(
                self.alias, LEADER_LEASE, node_id, self.token, now, ttl, previous=previous
            )
            if held is not None and held.acquired:
                self._record(ClusterEventKind.LEADER_ACQUIRED, held.fence, now, "became leader")
            elif held is None and self.held is not None:
                self._record(
                    ClusterEventKind.LEADER_LOST,
                    self.held.fence,
                    now,
                    "the leader lease was taken by another node",
                )
        self.held = held
        if held is not None:
            self.chores(now)

    def _refuses(self, now: datetime) -> bool:
        """True when this node must not lead: its clock disagrees with the live nodes' (SQLite).

        A holder resigns at once; the reason is logged when it changes."""
        verdict = MAY_LEAD
        if self.node.ledger.vendor.features.clock_is_local:
            verdict = self._clock.verdict(now)
        if verdict != self._verdict and verdict.refuses and not verdict.waiting:
            logger.error("node %s does not lead: %s", self.node.node_id, verdict.reason,
                         extra=self.node.log_extra)  # fmt: skip
        self._verdict = verdict
        if verdict.refuses and self.held is not None:
            self._record(ClusterEventKind.LEADER_LOST, self.held.fence, now,
                         f"resigned: {verdict.reason}")  # fmt: skip
            self.resign()
        return verdict.refuses

    def chores(self, now: datetime) -> bool:
        """Do the cluster chores fenced by the lease; False when this node is no longer leader."""
        held = self.held
        if held is None:
            return False
        chores = self.node.ledger.chores
        with transaction.atomic(using=self.alias):
            self._bound_lock_waits()
            if not leases.still_held(self.alias, held, now):
                logger.warning(
                    "deposed: leader chores of %s with fence %s rejected",
                    self.node.node_id,
                    held.fence,
                    extra=self.node.log_extra,
                )
                self.held = None
                return False
            node_id, dead_after = self.node.node_id, timedelta(seconds=app_settings.DEAD_AFTER)
            reaped = self._chore("reap", lambda: chores.reap_expired(now, node_id), 0)
            dead: list[str] = self._chore(
                "dead nodes", lambda: chores.mark_dead_nodes(now, dead_after, node_id), []
            )
            purged = self._chore("purge", lambda: self._purge(now), 0)
            names, fence = self.node.job_names(), held.fence
            self._chore("catch-up", lambda: catch_up(self.alias, names, node_id, now, fence), 0)
            self._record_chores(now, held.fence, reaped, purged)
        self._log(reaped, dead, purged)
        return True

    def _chore(self, name: str, chore: Callable[[], T], failed: T) -> T:
        """Run one chore in its own savepoint: one that fails (a row it cannot handle, a lock it
        waited too long for) is logged and rolled back, and the others still run."""
        try:
            with transaction.atomic(using=self.alias):
                return chore()
        except Exception:
            logger.exception("leader chore %s of %s failed; the other chores go on", name,
                             self.node.node_id, extra=self.node.log_extra)  # fmt: skip
            return failed

    def _bound_lock_waits(self) -> None:
        """Fail this beat rather than wait on a row lock held by a frozen process (the leader
        lease, or a run lease to reap): the heartbeat thread must come back to renew this node's
        own leases, and the next beat tries again."""
        self.node.ledger.vendor.bound_lock_waits(max(0.2, app_settings.HEARTBEAT_INTERVAL / 2))

    def _record_chores(self, now: datetime, fence: int, reaped: int, purged: int) -> None:
        done = [
            (ClusterEventKind.REAPED, reaped, "run(s) released after their lease expired"),
            (ClusterEventKind.PURGED, purged, "finished run(s) purged past retention"),
        ]
        ClusterEvent.objects.using(self.alias).bulk_create(
            [
                ClusterEvent(
                    at=now, kind=kind, node=self.node.node_id, fence=fence, detail=f"{count} {what}"
                )
                for kind, count, what in done
                if count
            ]
        )

    def _purge(self, now: datetime) -> int:
        if self._last_purge and (now - self._last_purge).total_seconds() < PURGE_EVERY:
            return 0
        self._last_purge = now
        return self.node.ledger.chores.purge(now, retention())

    def _log(self, reaped: int, dead: list[str], purged: int) -> None:
        extra = self.node.log_extra
        if reaped:
            logger.warning("released %d run(s) whose lease expired", reaped, extra=extra)
        for node_id in dead:
            logger.warning("node %s stopped heartbeating; marked dead", node_id, extra=extra)
        if purged:
            logger.info("purged %d finished run(s) past retention", purged, extra=extra)

    def resign(self) -> None:
        """Give the lease up so another node leads at once instead of after expiry."""
        if self.held is not None:
            leases.release(self.alias, self.held)
            self.held = None

    def _record(self, kind: str, fence: int, now: datetime, detail: str) -> None:
        level = logging.INFO if kind == ClusterEventKind.LEADER_ACQUIRED else logging.WARNING
        logger.log(
            level,
            "%s: %s (fence %s)",
            self.node.node_id,
            detail,
            fence,
            extra={**self.node.log_extra, "fence": fence},
        )
        ClusterEvent.objects.using(self.alias).create(
            at=now, kind=kind, node=self.node.node_id, fence=fence, detail=detail
        )


class LeaderThread(PeriodicThread):
    """Beats the leader every HEARTBEAT_INTERVAL seconds, apart from the heartbeat; the first
    beat as soon as the node starts (its chores never delay the node's first tick)."""

    what = "leader"
    at_once = True

    def __init__(self, leader: Leader) -> None:
        super().__init__(name=f"cluster-jobs-leader-{leader.node.node_id}")
        self.leader = leader

    def interval(self) -> float:
        return app_settings.HEARTBEAT_INTERVAL

    def step(self) -> None:
        self.leader.beat()

    def restarted(self) -> LeaderThread:
        return LeaderThread(self.leader)


def retention() -> timedelta:
    """How long finished runs are kept (no decision depends on them, whatever the schedules)."""
    return timedelta(days=app_settings.RETENTION_DAYS)

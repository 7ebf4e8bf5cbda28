"""The leader: one fenced lease; its holder alone reaps leases, buries dead nodes, purges and
settles missed occurrences, on a thread of its own so no chore delays a heartbeat.

Idle, the leader costs nothing beyond the heartbeat: the heartbeat statement renews the lease
the node holds and reads what the chores need (the lease, the live nodes and their heartbeats,
the earliest run lease expiry, the definitions counter), and the leader thread wakes only when
there is something to do: the lease looks free (try to take it), a renewal failed (see again,
its lock waits bounded), a run lease expires (reap at that instant), a node went silent (mark it
dead), definitions changed, a node started or a catch-up period passed (settle), a purge period
passed (purge).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar

from django.db import transaction

from ..conf import app_settings
from ..coordination.types import Heartbeat, LeaderRenewal
from ..ledger import leases
from ..models import LEADER_LEASE, ClusterEvent, ClusterEventKind
from .catchup import catch_up
from .clockcheck import MAY_LEAD, ClockCheck
from .periodic import PeriodicThread
from .protocols import LeaderHost

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Heartbeat intervals between two catch-up passes when nothing else asks for one (definitions
#: changed, a node registered, this node became leader): 60 s at the default 5 s.
CATCH_UP_EVERY = 12
#: Heartbeat intervals between two purges of the ledger by the same leader (10 min by default).
PURGE_EVERY = 120
#: Seconds past a run lease's expiry the leader reaps it.
REAP_MARGIN = 0.05
#: The chores, by name.
REAP, DEAD_NODES, PURGE, CATCH_UP = "reap", "dead nodes", "purge", "catch-up"
ALL_CHORES = frozenset({REAP, DEAD_NODES, PURGE, CATCH_UP})


class Leader:
    """Acquires or renews the leader lease at each beat and, while held, does the chores."""

    def __init__(self, host: LeaderHost, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.node = host
        self.token = uuid.uuid4().hex
        self.held: leases.Held | None = None
        self._last_purge: datetime | None = None
        #: On SQLite, where each node's clock is its own, whether it agrees with the others'.
        self._clock = ClockCheck(host.ledger.alias, host.node_id)
        self._verdict = MAY_LEAD
        self.monotonic = monotonic
        #: What the last heartbeat saw (None before the first): see observe().
        self.seen: Heartbeat | None = None
        #: True when the heartbeat's renewal of the held lease did not go through: see again.
        self._unsure = False
        self._version: int | None = None
        self._live: frozenset[str] = frozenset()
        #: Chores asked for by what the heartbeat saw, and the next periodic catch-up (monotonic).
        self._asked: set[str] = set()
        self._next_catch_up = float("-inf")
        #: observe() runs on the heartbeat thread, the rest on the leader thread.
        self._lock = threading.Lock()

    @property
    def alias(self) -> str:
        return self.node.ledger.alias

    # -- what the heartbeat tells (on the heartbeat thread) -----------------------------------

    def renewal(self, now: datetime) -> LeaderRenewal | None:
        """What the heartbeat renews: the lease this node holds, for another LEADER_TTL."""
        if self.held is None or self._unsure:
            return None
        return LeaderRenewal(self.token, now + timedelta(seconds=app_settings.LEADER_TTL))

    def observe(self, beat: Heartbeat, now: datetime, renewal: LeaderRenewal | None) -> bool:
        """Take in what a heartbeat saw; True when the leader thread has something to do."""
        with self._lock:
            self._observe(beat, renewal)
        return self.wanted(now) is not None

    def _observe(self, beat: Heartbeat, renewal: LeaderRenewal | None) -> None:
        held = self.held
        if held is not None and renewal is not None:
            if beat.leader_fence == held.fence:
                self.held = replace(held, expires_at=renewal.until)
            else:  # expired, taken, or its row locked by another transaction: see again
                self._unsure = True
        live = frozenset(p.node_id for p in beat.peers)
        if beat.definitions != self._version or not live <= self._live:
            self._asked.add(CATCH_UP)  # definitions changed, or a node (re)started
        self._version, self._live = beat.definitions, live
        self.seen = beat

    def wanted(self, now: datetime) -> frozenset[str] | None:
        """What the leader thread should do now: None for nothing, else the chores due (with a
        beat of the lease first when it is not held or its renewal failed)."""
        seen = self.seen
        if self.held is None:
            if seen is not None and seen.leader is not None and not seen.leader.free(now):
                return None  # another node leads until its lease expires
            return ALL_CHORES
        due = set(self._asked)
        if seen is not None:
            if seen.next_expiry is not None and seen.next_expiry <= now:
                due.add(REAP)
            silent = now - timedelta(seconds=app_settings.DEAD_AFTER)
            if any(p.last_heartbeat is not None and p.last_heartbeat < silent for p in seen.peers):
                due.add(DEAD_NODES)
        if self.monotonic() >= self._next_catch_up:
            due.add(CATCH_UP)
        if self._purge_due(now):
            due.add(PURGE)
        if self._unsure or due:
            return frozenset(due)
        return None

    def wait(self, now: datetime) -> float:
        """Seconds the leader thread may sleep: until a run lease expires or a period ends (a
        heartbeat pokes it sooner when it sees something to do)."""
        if self.held is None:
            return CATCH_UP_EVERY * app_settings.HEARTBEAT_INTERVAL
        waits = [self._next_catch_up - self.monotonic()]
        seen = self.seen
        if seen is not None and seen.next_expiry is not None:
            waits.append((seen.next_expiry - now).total_seconds() + REAP_MARGIN)
        return max(0.0, min(waits))

    def step(self) -> None:
        """One step of the leader thread: a beat of the lease and the chores that are due."""
        now = self.node.clock.now()
        wanted = self.wanted(now)
        if wanted is None:
            return
        if self.held is None or self._unsure:
            self.beat(now, chores=wanted)
        elif not self._refuses(now):
            self.chores(now, wanted)

    # -- the lease and the chores (on the leader thread) --------------------------------------

    def beat(self, now: datetime | None = None, chores: frozenset[str] = ALL_CHORES) -> None:
        """Take or keep the lease (a compare-and-set, its lock waits bounded); log and record
        every change of leader; then do ``chores`` (all of them on becoming leader)."""
        now = now or self.node.clock.now()
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
        self.held, self._unsure = held, False
        if held is not None and held.acquired:
            chores = ALL_CHORES  # a new leader settles, reaps and purges at once
            self._last_purge = None
        if held is not None:
            self.chores(now, chores)

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

    def chores(self, now: datetime, which: frozenset[str] = ALL_CHORES) -> bool:
        """Do the cluster chores fenced by the lease (``which`` of them, by name: all by
        default); False when this node is no longer leader."""
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
            reaped, purged, dead = 0, 0, list[str]()
            # With each purge (a new leader's first chores among them) the catch-up passes over
            # every job, moving the marks of those with nothing to settle too.
            everything = PURGE in which and self._purge_due(now)
            if REAP in which:
                reaped = self._chore(REAP, lambda: chores.reap_expired(now, node_id), 0)
            if DEAD_NODES in which:
                dead = self._chore(
                    DEAD_NODES, lambda: chores.mark_dead_nodes(now, dead_after, node_id), []
                )
            if PURGE in which:
                purged = self._chore(PURGE, lambda: self._purge(now), 0)
            if CATCH_UP in which:
                names, fence = self.node.job_names(), held.fence
                self._chore(CATCH_UP, lambda: catch_up(self.alias, names, node_id, now, fence,
                                                       everything=everything), 0)  # fmt: skip
                period = CATCH_UP_EVERY * app_settings.HEARTBEAT_INTERVAL
                self._next_catch_up = self.monotonic() + period
            self._record_chores(now, held.fence, reaped, purged)
        with self._lock:
            self._asked -= which
            if self.seen is not None:  # what was due is done: wait for the next beat's view
                self.seen = replace(self.seen, next_expiry=None, peers=())
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

    def _purge_due(self, now: datetime) -> bool:
        every = PURGE_EVERY * app_settings.HEARTBEAT_INTERVAL
        return self._last_purge is None or (now - self._last_purge).total_seconds() >= every

    def _purge(self, now: datetime) -> int:
        if not self._purge_due(now):
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
    """Runs the leader's steps apart from the heartbeat: the first as soon as the node starts
    (its chores never delay the node's first tick), then when the heartbeat pokes it or the
    leader's next deadline (a lease expiry, a period) comes."""

    what = "leader"
    at_once = True

    def __init__(self, leader: Leader) -> None:
        super().__init__(name=f"cluster-jobs-leader-{leader.node.node_id}")
        self.leader = leader

    def interval(self) -> float:
        return self.leader.wait(self.leader.node.clock.now())

    def step(self) -> None:
        self.leader.step()

    def restarted(self) -> LeaderThread:
        return LeaderThread(self.leader)


def retention() -> timedelta:
    """How long finished runs are kept (no decision depends on them, whatever the schedules)."""
    return timedelta(days=app_settings.RETENTION_DAYS)

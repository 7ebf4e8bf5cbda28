"""The heartbeat thread: clock offset, node row, run leases, definition changes, leadership."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections

from ..conf import app_settings
from ..models import ClusterEvent, ClusterEventKind, NodeStatus, WorkerNode
from .executor import release_broken_connections

if TYPE_CHECKING:
    from .node import Node

logger = logging.getLogger(__name__)

#: A measured offset larger than this is logged as a warning (the node still fires on time).
SKEW_WARNING = timedelta(seconds=1)


class HeartbeatThread(threading.Thread):
    """Beats every HEARTBEAT_INTERVAL seconds until stopped; a failed beat is logged, not fatal."""

    def __init__(self, node: Node) -> None:
        super().__init__(name=f"cluster-jobs-heartbeat-{node.node_id}", daemon=True)
        self.node = node
        self._halt = threading.Event()
        self._version: Any = None
        self._lost: set[int] = set()
        #: True once the heartbeat statement itself returns the database's clock (PostgreSQL):
        #: the offset is then measured on that round trip instead of a separate SELECT.
        self._clock_from_heartbeat = False

    def run(self) -> None:
        try:
            while not self._halt.wait(app_settings.HEARTBEAT_INTERVAL):
                self.beat()
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=app_settings.HEARTBEAT_INTERVAL + 5)

    @property
    def started(self) -> bool:
        return self.ident is not None

    def restarted(self) -> HeartbeatThread:
        """A new thread that carries on from this dead one (what it has seen)."""
        fresh = HeartbeatThread(self.node)
        fresh._version, fresh._lost = self._version, self._lost
        fresh._clock_from_heartbeat = self._clock_from_heartbeat
        return fresh

    def beat(self) -> None:
        """Measure the clock offset, renew the node and its leases, notice changes, lead."""
        try:
            if not self._clock_from_heartbeat:
                self.measure()
            self._renew()
            self._watch_definitions()
            self.node.leader.beat()
        except DatabaseError as exc:
            logger.warning(
                "heartbeat of %s failed: %s", self.node.node_id, exc, extra=self.node.log_extra
            )
            release_broken_connections()
        except Exception:  # whatever a chore or a stored row did: the next beat tries again
            logger.exception("heartbeat of %s failed", self.node.node_id, extra=self.node.log_extra)
            release_broken_connections()

    def measure(self) -> None:
        """Measure this node's clock offset to the database's: exactly where the database's
        clock is this host's (SQLite), else with one ``SELECT`` corrected by half its round trip."""
        clock = self.node.clock
        if self.node.coordinator.clock_is_local:
            clock.offset = clock.host_offset()
            self._clock_from_heartbeat = True  # nothing to measure again
            self._warn_skew()
            return
        sent = clock.local()
        db_time = self.node.coordinator.db_now()
        self._observe(sent, db_time, clock.local())

    def _observe(self, sent: datetime, db_time: datetime, received: datetime) -> None:
        self.node.clock.observe(sent, db_time, received)
        self._warn_skew()

    def _warn_skew(self) -> None:
        clock = self.node.clock
        if abs(clock.offset) > SKEW_WARNING:
            logger.warning(
                "node %s clock differs from the database's by %.3fs; using the database's",
                self.node.node_id,
                clock.offset.total_seconds(),
                extra=self.node.log_extra,
            )

    def _renew(self) -> None:
        node = self.node
        now = node.clock.now()
        lease_until = now + timedelta(seconds=app_settings.LEASE_TTL)
        offset_ms = node.clock.offset.total_seconds() * 1000
        running = {(active.won.run_id, active.won.fence) for active in node.runner.snapshot()}
        sent = node.clock.local()
        beat = node.coordinator.heartbeat(
            node.node_id, now, lease_until, node.counters.snapshot(offset_ms), running
        )
        if beat.db_time is not None:
            self._observe(sent, beat.db_time, node.clock.local())
            self._clock_from_heartbeat = True
        if beat.status == NodeStatus.DRAINING and not node.stopping:
            node.request_stop(reason="drain requested")
        elif beat.status == NodeStatus.DEAD:
            self._revive(now)
        self._notice_lost_runs({run_id for run_id, _ in running} - beat.owned_runs)
        if beat.cancel_requested:
            node.runner.cancel(set(beat.cancel_requested), why="cancel")

    def _notice_lost_runs(self, lost: set[int]) -> None:
        """Cancel handlers of runs this node renewed but the database no longer has under their
        fence (taken over after the lease expired while the node was paused or cut off)."""
        for run_id in lost - self._lost:
            logger.warning(
                "run %s is no longer owned by %s (its lease expired and it was taken "
                "over); its handler is cancelled and its result will be fenced out",
                run_id,
                self.node.node_id,
                extra={**self.node.log_extra, "run_id": run_id},
            )
        self._lost |= lost
        if lost:
            self.node.runner.cancel(lost, why="lost")

    def _revive(self, now: datetime) -> None:
        node = self.node
        status = NodeStatus.DRAINING if node.stopping else NodeStatus.ACTIVE
        WorkerNode.objects.using(node.coordinator.alias).filter(
            node_id=node.node_id, status=NodeStatus.DEAD
        ).update(status=status)
        ClusterEvent.objects.using(node.coordinator.alias).create(
            at=now,
            kind=ClusterEventKind.NODE_REVIVED,
            node=node.node_id,
            detail="heartbeat resumed after the node was marked dead",
        )
        logger.warning(
            "node %s was marked dead while it could not heartbeat; %s again",
            node.node_id,
            status,
            extra=node.log_extra,
        )

    def prime(self) -> None:
        """Read the definitions' fingerprint before the node's first load, so a definition
        saved while the node starts is seen as a change at the first heartbeat."""
        self._version = self.node.coordinator.definitions_version()

    def _watch_definitions(self) -> None:
        version = self.node.coordinator.definitions_version()
        if self._version is not None and version != self._version:
            logger.info("job definitions changed; re-planning", extra=self.node.log_extra)
            self.node.request_reload()
        self._version = version

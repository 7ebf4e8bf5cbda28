"""The heartbeat: clock offset, node row, run leases and definition changes, every interval.

It never waits on the leader's chores, which run on a thread of their own (engine.leader), so a
long catch-up cannot delay a lease renewal.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from ..conf import app_settings
from ..ledger.leases import lease_until
from ..models import ClusterEvent, ClusterEventKind, NodeStatus, WorkerNode
from .clock import align
from .periodic import PeriodicThread
from .protocols import HeartbeatHost
from .runner import Stop

logger = logging.getLogger(__name__)

#: A measured offset larger than this is logged as a warning (the node still fires on time).
SKEW_WARNING = timedelta(seconds=1)


class HeartbeatThread(PeriodicThread):
    """Beats every HEARTBEAT_INTERVAL seconds until stopped; a failed beat is logged, not fatal."""

    what = "heartbeat"

    def __init__(self, host: HeartbeatHost) -> None:
        super().__init__(name=f"cluster-jobs-heartbeat-{host.node_id}")
        self.host = host
        self._version: Any = None
        self._lost: set[int] = set()
        #: True once the offset is known without a SELECT of its own: from the heartbeat
        #: statement's round trip (PostgreSQL), or exactly (a database on this host, SQLite).
        self._clock_known = False

    def interval(self) -> float:
        return app_settings.HEARTBEAT_INTERVAL

    def step(self) -> None:
        self.beat()

    def restarted(self) -> HeartbeatThread:
        """A new thread that carries on from this dead one (what it has seen)."""
        fresh = HeartbeatThread(self.host)
        fresh._version, fresh._lost = self._version, self._lost
        fresh._clock_known = self._clock_known
        return fresh

    def beat(self) -> None:
        """Measure the clock offset, renew the node and its leases, notice definition changes:
        one statement on PostgreSQL and on SQLite (plus the leases' when it runs any)."""
        if not self._clock_known:
            self.measure()
        self._watch_definitions(self._renew())

    # -- the clock ----------------------------------------------------------------------------

    def measure(self) -> None:
        """Measure this node's clock offset to the database's: exactly where the database's
        clock is this host's (SQLite), else with one ``SELECT`` corrected by half its round trip."""
        vendor = self.host.ledger.vendor
        align(self.host.clock, vendor)
        self._clock_known = vendor.features.clock_is_local  # then nothing to measure again
        self._warn_skew()

    def _observe(self, sent: datetime, db_time: datetime, received: datetime) -> None:
        self.host.clock.observe(sent, db_time, received)
        self._warn_skew()

    def _warn_skew(self) -> None:
        offset = self.host.clock.offset
        if abs(offset) > SKEW_WARNING:
            logger.warning(
                "node %s clock differs from the database's by %.3fs; using the database's",
                self.host.node_id, offset.total_seconds(), extra=self.host.log_extra,
            )  # fmt: skip

    # -- renewing -----------------------------------------------------------------------------

    def _renew(self) -> int | None:
        """Renew the node row and its runs' leases; return the definitions counter."""
        host = self.host
        now = host.clock.now()
        offset_ms = host.clock.offset.total_seconds() * 1000
        running = {(active.won.run_id, active.won.fence) for active in host.runner.snapshot()}
        sent = host.clock.local()
        renewal = host.leader_renewal(now)
        beat = host.ledger.vendor.heartbeat(
            host.node_id, now, lease_until(now), host.counters.snapshot(offset_ms), running,
            leader=renewal,
        )  # fmt: skip
        if beat.db_time is not None:
            self._observe(sent, beat.db_time, host.clock.local())
            self._clock_known = True
        if beat.status == NodeStatus.DRAINING and not host.stopping:
            host.request_stop(reason="drain requested")
        elif beat.status == NodeStatus.DEAD:
            self._revive(now)
        # Lost: sent, not confirmed under its fence, and still running here under that fence (a
        # handler that ended meanwhile is no longer there; one that started is judged next beat).
        still = {(active.won.run_id, active.won.fence) for active in host.runner.snapshot()}
        self._lost &= {run_id for run_id, _ in still}
        self._notice_lost_runs(
            {run_id for run_id, fence in running & still if run_id not in beat.owned_runs}
        )
        if beat.cancel_requested:
            host.runner.cancel(set(beat.cancel_requested), why=Stop.CANCEL)
        host.peers_seen(beat.peers)
        host.leader_observed(beat, now, renewal)
        return beat.definitions

    def _notice_lost_runs(self, lost: set[int]) -> None:
        """Cancel handlers of runs this node renewed but the database no longer has under their
        fence (taken over after the lease expired while the node was paused or cut off)."""
        for run_id in lost - self._lost:
            logger.warning(
                "run %s is no longer owned by %s (its lease expired and it was taken over); its "
                "handler is cancelled and its result will be fenced out", run_id,
                self.host.node_id, extra={**self.host.log_extra, "run_id": run_id},
            )  # fmt: skip
        self._lost |= lost
        if lost:
            self.host.runner.cancel(lost, why=Stop.LOST)

    def _revive(self, now: datetime) -> None:
        host, alias = self.host, self.host.ledger.alias
        status = NodeStatus.DRAINING if host.stopping else NodeStatus.ACTIVE
        WorkerNode.objects.using(alias).filter(node_id=host.node_id, status=NodeStatus.DEAD).update(
            status=status
        )
        ClusterEvent.objects.using(alias).create(
            at=now, kind=ClusterEventKind.NODE_REVIVED, node=host.node_id,
            detail="heartbeat resumed after the node was marked dead",
        )  # fmt: skip
        logger.warning("node %s was marked dead while it could not heartbeat; %s again",
                       host.node_id, status, extra=host.log_extra)  # fmt: skip

    # -- definitions --------------------------------------------------------------------------

    def prime(self) -> None:
        """Read the definitions counter before the node's first load, so a definition saved
        while the node starts is seen as a change at the first heartbeat."""
        self._version = self.host.ledger.definitions_version()

    def _watch_definitions(self, version: int | None) -> None:
        if self._version is not None and version != self._version:
            logger.info("job definitions changed; re-planning", extra=self.host.log_extra)
            self.host.request_reload()
        self._version = version

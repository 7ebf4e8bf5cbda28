"""Whether this node's clock agrees with the other live nodes': the condition to lead on SQLite.

On PostgreSQL every node's clock is corrected to the database server's, so the leader's chores
are judged on one clock. SQLite runs inside each process: there the database's clock is the
node's own, and a node whose clock is wrong (all nodes share one host, but a process can be run
with a faked time) would, as leader, reap live leases, mark healthy nodes dead and settle
occurrences that have not happened yet. So a node leads only when its clock agrees, within
:func:`bound`, with a strict majority of the live nodes, itself included. A node is live when its
heartbeat advanced between two looks (a crashed node's stale row counts for nothing).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..conf import app_settings
from ..models import NodeStatus, WorkerNode
from .firing import MISFIRE_GRACE


def bound() -> timedelta:
    """The clock difference beyond which two nodes disagree (a late heartbeat is not one)."""
    return max(MISFIRE_GRACE, timedelta(seconds=2 * app_settings.HEARTBEAT_INTERVAL))


class ClockCheck:
    """Remembers the other nodes' heartbeats from one look to the next."""

    def __init__(self, alias: str, node_id: str) -> None:
        self.alias, self.node_id = alias, node_id
        self._seen: dict[str, datetime] | None = None

    def disagreement(self, now: datetime) -> str:
        """Return why this node must not lead now, or "" when it may."""
        rows = dict(
            WorkerNode.objects.using(self.alias)
            .filter(status__in=(NodeStatus.ACTIVE, NodeStatus.DRAINING))
            .exclude(node_id=self.node_id)
            .values_list("node_id", "last_heartbeat")
        )
        seen, self._seen = self._seen, rows
        if not rows:
            return ""
        if seen is None:
            return "waiting one heartbeat to tell which other nodes are live"
        live = {n: beat for n, beat in rows.items() if n in seen and beat != seen[n]}
        off = {n: beat for n, beat in live.items() if not self._agrees(now, beat)}
        if 2 * (1 + len(live) - len(off)) > 1 + len(live):
            return ""
        return f"its clock disagrees with {_describe(now, off)}"

    @staticmethod
    def _agrees(now: datetime, beat: datetime) -> bool:
        late = timedelta(seconds=app_settings.HEARTBEAT_INTERVAL)
        return -bound() <= now - beat <= late + bound()


def _describe(now: datetime, off: dict[str, datetime]) -> str:
    parts = []
    for node, beat in sorted(off.items()):
        seconds = (now - beat).total_seconds()
        side = "behind" if seconds > 0 else "ahead of"
        parts.append(f"{node}, whose last heartbeat is {abs(seconds):.1f} s {side} this clock")
    return "; ".join(parts)

"""Whether this node's clock agrees with the other live nodes': the condition to lead on SQLite.

On PostgreSQL every node's clock is corrected to the database server's, so the leader's chores
are judged on one clock. SQLite runs inside each process: there the database's clock is the
node's own, and a node whose clock is wrong (all nodes share one host, but a process can be run
with a faked time) would, as leader, reap live leases, mark healthy nodes dead and settle
occurrences that have not happened yet. So a node leads only when its clock agrees, within
:func:`bound`, with a strict majority of the live nodes, itself included. A node is live when its
heartbeat advanced between two looks at least :func:`window` apart (a crashed node's stale row
counts for nothing).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..conf import app_settings
from ..models import NodeStatus, WorkerNode
from .claimer import MISFIRE_GRACE


def window() -> float:
    """Seconds between two looks in which every live node has heartbeat at least once."""
    return 1.5 * app_settings.HEARTBEAT_INTERVAL


def bound() -> timedelta:
    """The clock difference beyond which two nodes disagree (a late heartbeat is not one)."""
    return max(MISFIRE_GRACE, timedelta(seconds=2 * app_settings.HEARTBEAT_INTERVAL))


@dataclass(frozen=True)
class Verdict:
    """Whether this node may lead now; ``waiting`` while it cannot tell yet (not an error)."""

    refuses: bool = False
    waiting: bool = False
    reason: str = ""


#: The verdict when nothing stands against leading.
MAY_LEAD = Verdict()


class ClockCheck:
    """Remembers the other nodes' heartbeats from one look to the next.

    A node is live when its heartbeat advanced since a look at least :func:`window` ago, on this
    process's monotonic clock (the one clock here that the wrong time cannot move): looks closer
    together than one heartbeat interval can see no heartbeat advance, which must not read as
    "no other node is live".
    """

    def __init__(
        self, alias: str, node_id: str, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.alias, self.node_id, self.monotonic = alias, node_id, monotonic
        #: Earlier looks, oldest first: (monotonic time, {node: last heartbeat}).
        self._looks: deque[tuple[float, dict[str, datetime]]] = deque()

    def verdict(self, now: datetime) -> Verdict:
        """Return whether, and why, this node must not lead now."""
        rows = dict(
            WorkerNode.objects.using(self.alias)
            .filter(status__in=(NodeStatus.ACTIVE, NodeStatus.DRAINING))
            .exclude(node_id=self.node_id)
            .values_list("node_id", "last_heartbeat")
        )
        seen = self._remember(rows)
        if not rows:
            return MAY_LEAD
        if seen is None:
            why = "waiting one heartbeat to tell which other nodes are live"
            return Verdict(refuses=True, waiting=True, reason=why)
        live = {n: beat for n, beat in rows.items() if n in seen and beat != seen[n]}
        off = {n: beat for n, beat in live.items() if not self._agrees(now, beat)}
        if 2 * (1 + len(live) - len(off)) > 1 + len(live):
            return MAY_LEAD
        return Verdict(refuses=True, reason=f"its clock disagrees with {_describe(now, off)}")

    def _remember(self, rows: dict[str, datetime]) -> dict[str, datetime] | None:
        """Keep this look; return the newest earlier one at least a window old, if any."""
        at, span = self.monotonic(), window()
        self._looks.append((at, rows))
        while len(self._looks) > 1 and at - self._looks[1][0] >= span:
            self._looks.popleft()  # the next one is old enough too: judge against the newest
        first_at, first = self._looks[0]
        return first if at - first_at >= span else None

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

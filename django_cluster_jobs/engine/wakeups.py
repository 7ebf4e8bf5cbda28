"""Which nodes a pending notification wakes: as many as there is work for, never none while a
node is free.

Every listening node hears every notification on PostgreSQL, so each decides alone, from facts
every node shares, whether it is one of those the notification is for:

- the payload counts the runs made pending (``"3"``); an empty one (a release by a chore, a
  retry: a number nobody counted) wakes every node;
- the live nodes, ordered by id, as the node's last heartbeat read them;
- where the notification starts in that order: the sending session's process id (the same for
  every listener), or the position a passed-on notification names.

The notification wakes the ``ceil(count / threads)`` nodes from that position on. A woken node
that cannot take its share (its threads are busy) passes what it could not take on to the
nodes after those, at once, with a notification of its own (``"count position hops"``), until
every node was asked once. A node the notification is not for looks for due runs itself one
``POLL_INTERVAL`` later, in case the views of the live nodes differ for a moment (a node just
started or died): a run then waits at most that long, never until a later notification.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil


@dataclass(frozen=True)
class Wake:
    """A notification that ``count`` runs became pending, for the nodes from ``start`` on
    (modulo the number of live nodes); ``hops`` nodes were asked before."""

    count: int
    start: int
    hops: int = 0

    def payload(self) -> str:
        """The notification's payload that passes this wake-up on."""
        return f"{self.count} {self.start} {self.hops}"


def parse(payload: str, pid: int) -> Wake | None:
    """The wake-up a notification's payload asks for; None (every node) when it counts nothing
    or cannot be read."""
    parts = payload.split()
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        return None
    if len(numbers) == 1 and numbers[0] > 0:
        return Wake(numbers[0], pid)
    if len(numbers) == 3 and numbers[0] > 0 and min(numbers[1:]) >= 0:
        return Wake(*numbers)
    return None


def width(wake: Wake, nodes: int, threads: int) -> int:
    """How many nodes ``wake`` is for: as many as its runs fill, at most every node."""
    return max(1, min(nodes, ceil(wake.count / max(1, threads))))


def share(wake: Wake | None, live: Sequence[str], me: str, threads: int) -> int:
    """How many of the wake-up's runs are this node's to take: 0 when it is for other nodes;
    ``threads`` for every node when it names no count or this node is not in ``live`` (its view
    is behind: it takes rather than leave a run waiting)."""
    if wake is None or me not in live:
        return threads
    order = sorted(live)
    offset = (order.index(me) - wake.start) % len(order)
    if offset >= width(wake, len(order), threads):
        return 0
    return min(threads, wake.count - offset * threads)


def passed_on(wake: Wake, short: int, nodes: int, threads: int) -> Wake | None:
    """The wake-up that asks the next nodes for the ``short`` runs a woken node could not take;
    None once every node was asked."""
    asked = width(wake, nodes, threads)
    if short < 1 or wake.hops + asked >= nodes:
        return None
    return Wake(short, (wake.start + asked) % nodes, wake.hops + asked)

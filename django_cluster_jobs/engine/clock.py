"""Cluster time: this node's clock plus its offset to the database's clock (from heartbeats)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any


class Clock:
    """The node's view of cluster time; ``skew`` lets tests make a node's own clock wrong."""

    def __init__(self, skew: timedelta = timedelta(0)) -> None:
        self.skew = skew
        #: Database clock minus local clock, measured by :meth:`observe`.
        self.offset = timedelta(0)

    def local(self) -> datetime:
        """Return this machine's (possibly skewed) wall-clock time."""
        return datetime.fromtimestamp(time.time(), UTC) + self.skew

    def now(self) -> datetime:
        """Return cluster time: local time corrected by the measured database offset."""
        return self.local() + self.offset

    def host_offset(self) -> timedelta:
        """Return this host's clock minus this node's, exactly: what the offset is when the
        database runs on this host (SQLite), no round trip to estimate. Zero for a real clock;
        a test clock with a ``skew`` is that far off the host's."""
        return -self.skew

    def observe(self, sent: datetime, db_time: datetime, received: datetime) -> None:
        """Record the offset from one round trip, assuming the server answered half-way."""
        self.offset = db_time - (sent + (received - sent) / 2)


def align(clock: Clock, vendor: Any) -> None:
    """Set the clock's offset to the database's: exactly where the database's clock is this
    host's (SQLite), else from one ``SELECT`` of it, corrected by half the round trip."""
    if vendor.features.clock_is_local:
        clock.offset = clock.host_offset()
        return
    sent = clock.local()
    db_time = vendor.db_now()
    clock.observe(sent, db_time, clock.local())

"""What wakes an idle node when runs become pending: PostgreSQL's LISTEN on a dedicated
connection (as many nodes as there are runs for: engine.wakeups), or on SQLite a look at the
wake file beside the database."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from django.db import connections

from ..coordination import wakefile
from ..coordination.postgresql import PENDING_CHANNEL
from .periodic import PeriodicThread
from .wakeups import Wake, parse

logger = logging.getLogger(__name__)

#: Seconds between two looks at the halt flag while listening, and before reconnecting.
LOOK = 0.5
RECONNECT = 1.0


class PendingListener(PeriodicThread):
    """Keeps one LISTEN connection open (reconnecting after errors) and calls ``notified`` with
    each notification's wake-up (None: look now, whatever the notification is for)."""

    what = "pending listener"
    at_once = True
    #: NOTIFY is sent with the commit that made the run pending: no look is needed besides.
    safety_polls: int | None = None

    def __init__(self, alias: str, node_id: str, notified: Callable[[Wake | None], None]) -> None:
        super().__init__(name=f"cluster-jobs-listen-{node_id}")
        self.alias, self.notified = alias, notified
        #: True while a LISTEN connection is open; the node polls while it is not.
        self.healthy = False

    def interval(self) -> float:
        return RECONNECT

    def step(self) -> None:
        """Listen until halted; a lost connection ends the step (the node polls meanwhile)."""
        try:
            self._listen()
        finally:
            self.notified(None)  # whatever became pending while nobody listened

    def restarted(self) -> PendingListener:
        node_id = self.name.removeprefix("cluster-jobs-listen-")
        return PendingListener(self.alias, node_id, self.notified)

    def _listen(self) -> None:
        wrapper = connections[self.alias]
        conn = wrapper.get_new_connection(wrapper.get_connection_params())
        try:
            conn.autocommit = True
            conn.execute(f"LISTEN {PENDING_CHANNEL}")
            self.healthy = True
            self.notified(None)  # anything made pending while we were not listening
            while not self.stopped:
                for notify in conn.notifies(timeout=LOOK):
                    self.notified(parse(notify.payload, notify.pid))
        finally:
            self.healthy = False
            conn.close()


#: Seconds between two looks at the wake file: a ``stat``, no statement.
WATCH = 0.05
#: A node woken through the wake file still looks for pending runs this many poll intervals
#: apart, for a run whose writer could not signal (a failed signal is logged by its writer).
SAFETY_POLLS = 10


class FileListener(PeriodicThread):
    """Watches the wake file beside an SQLite database (coordination.wakefile) and calls
    ``wake`` when it changed: SQLite's counterpart of the PostgreSQL listener."""

    what = "pending watcher"
    at_once = True
    safety_polls: int | None = SAFETY_POLLS

    def __init__(self, path: Path, node_id: str, wake: Callable[[], None]) -> None:
        super().__init__(name=f"cluster-jobs-watch-{node_id}")
        self.path, self.wake = path, wake
        #: True while the file can be watched; the node polls as often as without it while not.
        self.healthy = False
        self._seen: wakefile.Stamp | bool = False  # never a stamp: the first look wakes

    def interval(self) -> float:
        return WATCH

    def run(self) -> None:
        try:
            super().run()
        finally:
            self.healthy = False  # stopped or dead: the node polls again

    def step(self) -> None:
        try:
            now = wakefile.stamp(self.path)
        except OSError:
            self.healthy = False
            raise
        self.healthy = True
        if now != self._seen:
            self._seen = now
            self.wake()

    def restarted(self) -> FileListener:
        node_id = self.name.removeprefix("cluster-jobs-watch-")
        return FileListener(self.path, node_id, self.wake)

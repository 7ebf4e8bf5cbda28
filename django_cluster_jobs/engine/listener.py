"""PostgreSQL LISTEN on a dedicated connection: wakes an idle node when runs become pending (as
many nodes as there are runs for: engine.wakeups)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import connections

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

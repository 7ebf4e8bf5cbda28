"""PostgreSQL LISTEN on a dedicated connection: wakes an idle node when a run becomes pending."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from django.db import connections

from ..coordination.postgresql import PENDING_CHANNEL

if TYPE_CHECKING:
    from .node import Node

logger = logging.getLogger(__name__)


class PendingListener(threading.Thread):
    """Keeps one LISTEN connection open (reconnecting after errors) and wakes the node."""

    def __init__(self, node: Node) -> None:
        super().__init__(name=f"cluster-jobs-listen-{node.node_id}", daemon=True)
        self.node = node
        self._halt = threading.Event()
        #: True while a LISTEN connection is open; the node polls while it is not.
        self.healthy = False

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._listen()
            except Exception as exc:  # a lost connection: retry, the node polls meanwhile
                logger.warning(
                    "LISTEN connection lost (%s); reconnecting", exc, extra=self.node.log_extra
                )
                self.node.wake_pending()
                self._halt.wait(1.0)

    def _listen(self) -> None:
        wrapper = connections[self.node.coordinator.alias]
        conn = wrapper.get_new_connection(wrapper.get_connection_params())
        try:
            conn.autocommit = True
            conn.execute(f"LISTEN {PENDING_CHANNEL}")
            self.healthy = True
            self.node.wake_pending()  # anything made pending while we were not listening
            while not self._halt.is_set():
                for _ in conn.notifies(timeout=0.5):
                    self.node.wake_pending()
        finally:
            self.healthy = False
            conn.close()

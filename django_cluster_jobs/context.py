"""What a handler may receive: the run context."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class RunContext:
    """Everything a handler may want to know about the run it is executing."""

    run_id: int
    job: str
    key: str
    scheduled_at: datetime
    attempt: int
    fence: int
    node_id: str
    payload: dict[str, Any]
    logger: logging.LoggerAdapter
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def idempotency_key(self) -> str:
        """The same for every attempt of this occurrence (or enqueued run), and for no other:
        give it to what the handler asks outside the database (an HTTP API's idempotency
        key, an email's message id), so a retry is recognised there as the same request."""
        return f"{self.job}@{self.key}"

    @property
    def cancelled(self) -> bool:
        """True once the run was asked to stop (cancel, timeout or shutdown)."""
        return self.cancel_event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return True early if the run is cancelled."""
        return self.cancel_event.wait(seconds)

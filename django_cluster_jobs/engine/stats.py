"""What a node decided, counted for the admin and the logs."""

from __future__ import annotations

import threading
from collections import Counter

from ..coordination import NodeStats

#: Reasons a node skips an occurrence (the keys of WorkerNode.skipped).
CLAIMED_ELSEWHERE = "claimed_elsewhere"
CLAIM_FAILED = "claim_failed"
DISABLED = "disabled"
NODE_BUSY = "node_busy"
MISSED = "missed"
DRAINING = "draining"
PAUSED = "paused"
OVERLAP = "overlap"
BUFFERED = "buffered"
CONCURRENCY = "max_concurrency"
QUEUE_LIMIT = "queue_limit"
#: Refused because the job's mark had already settled the occurrence (claimed or missed).
SETTLED = "settled"
#: Refused because the definition changed since this node planned the occurrence (it re-plans).
CHANGED = "changed"
#: Held back until this node's own live run of the job ends: it fell due before that run began.
DEFERRED = "deferred"


class Counters:
    """Thread-safe tallies of claims won, lost and skipped by reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.won = 0
        self.lost = 0
        self.skipped: Counter[str] = Counter()

    def add(self, *, won: int = 0, lost: int = 0, skipped: str | None = None, n: int = 1) -> None:
        with self._lock:
            self.won += won
            self.lost += lost
            if skipped:
                self.skipped[skipped] += n

    def snapshot(self, clock_offset_ms: float) -> NodeStats:
        with self._lock:
            return NodeStats(clock_offset_ms, self.won, self.lost, dict(self.skipped))

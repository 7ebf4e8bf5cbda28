"""What each part of a node needs from the node: narrow protocols, so a test fakes just these."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Protocol

from ..coordination import Heartbeat, Peer, Won
from ..coordination.types import LeaderRenewal
from ..ledger import Ledger
from .clock import Clock
from .planner import Planned
from .runner import Stop
from .stats import Counters


class Logs(Protocol):
    node_id: str

    @property
    def log_extra(self) -> dict[str, str]: ...


class ClaimerHost(Logs, Protocol):
    """What the claimer and the taker of pending runs use."""

    clock: Clock
    ledger: Ledger
    counters: Counters
    wake: threading.Event

    @property
    def stopping(self) -> bool: ...

    @property
    def listening(self) -> bool: ...

    def look_every(self) -> float | None: ...

    def free_threads(self) -> int: ...

    @property
    def threads(self) -> int: ...

    @property
    def live_nodes(self) -> Sequence[str]: ...

    def start_run(
        self,
        won: Won,
        planned: Planned,
        scheduled_at: datetime,
        payload: dict,
        on_done: Callable[[datetime], None] | None = None,
    ) -> None: ...

    def request_reload(self, jobs: Collection[str] = ()) -> None: ...


class Runs(Protocol):
    def snapshot(self) -> list: ...

    def cancel(self, run_ids: set[int] | None = None, why: Stop = Stop.SHUTDOWN) -> None: ...


class HeartbeatHost(Logs, Protocol):
    """What the heartbeat uses."""

    clock: Clock
    ledger: Ledger
    counters: Counters

    @property
    def runner(self) -> Runs: ...

    @property
    def stopping(self) -> bool: ...

    def request_stop(self, reason: str = "signal") -> None: ...

    def request_reload(self, jobs: Collection[str] = ()) -> None: ...

    def peers_seen(self, peers: Sequence[Peer]) -> None: ...

    def leader_renewal(self, now: datetime) -> LeaderRenewal | None: ...

    def leader_observed(
        self, beat: Heartbeat, now: datetime, renewal: LeaderRenewal | None
    ) -> None: ...


class LeaderHost(Logs, Protocol):
    """What the leader uses."""

    clock: Clock
    ledger: Ledger

    def job_names(self) -> list[str]: ...

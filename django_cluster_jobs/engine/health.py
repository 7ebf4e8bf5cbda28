"""What the probes ask of a node, answered from memory: no database query per request.

The node stamps its lifecycle here (started, definitions loaded, each tick and each sleep); the
heartbeat thread's own stamps (engine.periodic) say when it last stepped and last reached the
database. A probe server (observe.probes) turns the three verdicts into HTTP answers.

- live: the loop is not stuck (it ticks, or sleeps no longer than it said it would) and the
  heartbeat thread keeps stepping, whether or not the database answers: a database outage must
  not make Kubernetes restart every pod.
- ready: started, the database answered the latest heartbeat recently, definitions are loaded
  and the node is not draining.
- started: :meth:`Node.start` has finished (registered, measured the clock, loaded the jobs,
  started its threads).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from ..conf import app_settings


class Stepping(Protocol):
    """The heartbeat thread, as the probes see it (engine.periodic.PeriodicThread)."""

    last_step: float | None
    last_ok: float | None


class HealthHost(Protocol):
    """What the health reads from the node."""

    @property
    def heartbeat(self) -> Stepping: ...

    @property
    def stopping(self) -> bool: ...


@dataclass(frozen=True)
class Verdict:
    """A probe's answer: whether it passes, and each check by name (for the response body)."""

    ok: bool
    checks: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, **checks: bool) -> Verdict:
        return cls(all(checks.values()), checks)


def stall_after() -> float:
    """Seconds without progress after which the node is not live: DEAD_AFTER, the time after
    which the cluster itself gives the node up."""
    return app_settings.DEAD_AFTER


def database_window() -> float:
    """Seconds a successful heartbeat vouches for the database: three heartbeats."""
    return 3 * app_settings.HEARTBEAT_INTERVAL


class NodeHealth:
    """The node's lifecycle stamps and the three verdicts the probes serve (thread-safe)."""

    def __init__(self, host: HealthHost) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._started: float | None = None
        self._loaded = False
        self._loop_deadline: float | None = None

    # -- stamps (the node's loop and lifecycle) -----------------------------------------------

    def mark_started(self) -> None:
        with self._lock:
            self._started = time.monotonic()

    def mark_loaded(self) -> None:
        with self._lock:
            self._loaded = True

    def mark_ticking(self) -> None:
        """A tick begins: it must end (and the loop sleep or tick again) within the stall time."""
        self._expect(0.0)

    def mark_sleeping(self, seconds: float) -> None:
        """The loop sleeps at most ``seconds``, then ticks."""
        self._expect(seconds)

    def _expect(self, seconds: float) -> None:
        with self._lock:
            self._loop_deadline = time.monotonic() + seconds + stall_after()

    # -- verdicts -----------------------------------------------------------------------------

    def live(self) -> Verdict:
        now = time.monotonic()
        with self._lock:
            started, deadline = self._started, self._loop_deadline
        if started is None:  # the startup probe covers start(); liveness waits for it
            return Verdict.of(loop=True, heartbeat=True)
        draining = self.host.stopping  # the loop has ended on purpose; the drain is bounded
        beat = self.host.heartbeat.last_step or started
        heartbeat_due = beat + app_settings.HEARTBEAT_INTERVAL + stall_after()
        return Verdict.of(
            loop=draining or deadline is None or now <= deadline,
            heartbeat=draining or now <= heartbeat_due,
        )

    def ready(self) -> Verdict:
        with self._lock:
            started, loaded = self._started, self._loaded
        return Verdict.of(
            started=started is not None,
            database=started is not None and self._database_answers(started),
            definitions=loaded,
            not_draining=not self.host.stopping,
        )

    def _database_answers(self, started: float) -> bool:
        """The latest heartbeat step reached the database, recently (start() beat once)."""
        beat = self.host.heartbeat
        if beat.last_step is not None and beat.last_ok != beat.last_step:
            return False
        last = beat.last_ok if beat.last_ok is not None else started
        return time.monotonic() - last <= database_window()

    def started(self) -> Verdict:
        with self._lock:
            return Verdict.of(started=self._started is not None)

"""One base for the node's background threads: a step repeated every interval until stopped.

A step that raises is logged and the thread goes on (the next step tries again); a thread that
dies anyway is noticed by the node's supervision, which restarts it or stops the node.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, connections

from .executor import release_broken_connections

logger = logging.getLogger(__name__)


class PeriodicThread(threading.Thread):
    """Call :meth:`step` every ``interval()`` seconds until :meth:`stop`: the first step at once
    when ``at_once``, else after the first interval."""

    #: What the log calls this thread.
    what = "background thread"
    #: Whether the first step runs as soon as the thread starts.
    at_once = False

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._halt = threading.Event()
        self._poke = threading.Event()
        #: time.monotonic() at the end of the latest step, and of the latest that raised nothing
        #: (what the probes read: engine.health).
        self.last_step: float | None = None
        self.last_ok: float | None = None

    def interval(self) -> float:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def restarted(self) -> PeriodicThread:
        """A new thread that carries on from this dead one (the node's supervision starts it)."""
        raise NotImplementedError

    def run(self) -> None:
        try:
            if self.at_once and not self._halt.is_set():
                self.step_contained()
            while True:
                self._poke.wait(self.interval())
                self._poke.clear()
                if self._halt.is_set():
                    break
                self.step_contained()
        finally:
            connections.close_all()

    def step_contained(self) -> None:
        """Run one step; log (never raise) what it raised, and keep usable connections."""
        ok = False
        try:
            self.step()
            ok = True
        except DatabaseError as exc:
            logger.warning("%s %s failed: %s", self.what, self.name, exc)
            release_broken_connections()
        except Exception:  # whatever a stored row did: the next step tries again
            logger.exception("%s %s failed", self.what, self.name)
            release_broken_connections()
        finally:
            self.last_step = time.monotonic()
            self.last_ok = self.last_step if ok else self.last_ok

    @property
    def stopped(self) -> bool:
        return self._halt.is_set()

    @property
    def started(self) -> bool:
        return self.ident is not None

    def poke(self) -> None:
        """Take the next step now rather than at the end of the interval."""
        self._poke.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._halt.set()
        self._poke.set()
        if self.is_alive():
            self.join(timeout=timeout)

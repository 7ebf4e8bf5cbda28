"""A bounded pool of daemon threads, so a hung handler can never keep the process alive."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from django.db import connections

logger = logging.getLogger(__name__)


def release_broken_connections() -> None:
    """Close this thread's connections that an error left unusable, keep the healthy ones."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()


class Executor:
    """Runs at most ``threads`` callables at once; ``submit`` refuses when all are busy."""

    def __init__(self, threads: int, name: str = "cluster-jobs") -> None:
        self.threads = threads
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._busy = 0
        self._lock = threading.Condition()
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        """Start the worker threads (the constructor starts nothing)."""
        for worker in self._workers:
            if worker.ident is None:
                worker.start()

    @property
    def free(self) -> int:
        with self._lock:
            return self.threads - self._busy

    def submit(self, task: Callable[[], None]) -> bool:
        """Queue ``task`` if a thread is free for it; return False when the pool is full."""
        with self._lock:
            if self._busy >= self.threads:
                return False
            self._busy += 1
        self._tasks.put(task)
        return True

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no task runs; return False if ``timeout`` seconds passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: self._busy == 0, timeout=timeout)

    def shutdown(self) -> None:
        """Let idle workers exit; busy (hung) daemon threads die with the process."""
        for worker in self._workers:
            if worker.ident is not None:
                self._tasks.put(None)

    def _work(self) -> None:
        try:
            while (task := self._tasks.get()) is not None:
                try:
                    task()
                except Exception:  # the task records its own failure; this is a last resort
                    logger.exception("unexpected error in an executor task")
                finally:
                    release_broken_connections()
                    with self._lock:
                        self._busy -= 1
                        self._lock.notify_all()
        finally:
            connections.close_all()

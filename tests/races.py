"""Races between threads, each on its own database connection, under a hard deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import connections

from tests import timing

T = TypeVar("T")

#: How long the racers of one race may take, all together, before the race fails as hung: a hang
#: guard hundreds of times longer than a race takes, so a race is not a timing test.
RACE_DEADLINE = timing.RACE


def race(n: int, fn: Callable[[int], T], *, deadline: float = RACE_DEADLINE) -> list[T]:
    """Run ``fn(0)`` … ``fn(n - 1)`` in ``n`` threads released at once; return their results.

    Each thread opens its own connection before the start and closes it after. The race fails
    when a thread is still alive at ``deadline`` (it hung) and re-raises what a thread raised.
    """
    barrier = threading.Barrier(n, timeout=deadline)
    results: list[T | None] = [None] * n
    errors: list[BaseException] = []

    def racer(i: int) -> None:
        try:
            connections["default"].ensure_connection()
            barrier.wait()
            results[i] = fn(i)
        except BaseException as exc:  # re-raised in the test's thread below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=racer, args=(i,), name=f"racer-{i}", daemon=True)
               for i in range(n)]  # fmt: skip
    for thread in threads:
        thread.start()
    end = time.monotonic() + deadline
    for thread in threads:
        thread.join(timeout=max(0.0, end - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    assert not hung, f"{', '.join(hung)} still running after {deadline:g} s: hung"
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]

"""django.tasks tasks of the test suite, run by the ClusterJobsBackend."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from tests.timing import scaled

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


class Boom(Exception):
    pass


@task
def add(a: int, b: int = 0) -> int:
    return a + b


@task(priority=5, queue_name="other")
def echo(*args, **kwargs) -> dict:
    return {"args": list(args), "kwargs": kwargs}


@task
def fails(message: str) -> None:
    raise Boom(message)


@task
def unjsonable() -> object:
    return object()


@task(max_attempts=2, backoff={"kind": "fixed", "base": 0.1})
def flaky(marker: str) -> str:
    """Fail on the first attempt (no marker file yet), succeed on the second."""
    path = Path(marker)
    if not path.exists():
        path.write_text("1")
        raise Boom("first attempt")
    return "second"


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(scaled(0.01))
    return a + b


@task(takes_context=True)
def with_context(context, label: str) -> dict:
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task
def slow(marker: str, seconds: float) -> int:
    """Write the pid to ``marker`` on the first attempt, then sleep; later attempts return."""
    path = Path(marker)
    if not path.exists():
        path.write_text(str(os.getpid()))
        time.sleep(seconds)
    return os.getpid()


# A periodic task, disabled until a test enables it (as an operator would, in the admin).
from django_cluster_jobs.tasks.periodic import schedule  # noqa: E402

every_second = schedule(
    add, cron="* * * * * *", args=[40], kwargs={"b": 2}, name="tests.task_defs.add_every_second",
    enabled=False,
)  # fmt: skip


@task(timeout=scaled(0.3))
async def overruns() -> None:
    await asyncio.sleep(scaled(30))


@task(backend="at_most_once")
def slow_once(marker: str, seconds: float) -> None:
    Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)

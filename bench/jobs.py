"""Jobs the benchmarks run. Each returns when its handler started, so lag is measured there.

Scheduled jobs are declared only when BENCH_JOBS names them, so a node plans nothing else.
"""

import os
import time
from collections.abc import Callable
from typing import Any

from django_cluster_jobs import RunContext, job

ENABLED = set(filter(None, os.environ.get("BENCH_JOBS", "").split(",")))


def handler_started() -> dict[str, float]:
    """The result every bench job stores: this machine's clock when the handler began."""
    return {"handler_started": time.time()}


def scheduled(name: str, **schedule: Any) -> Callable[[Callable[..., Any]], Any]:
    """Declare ``bench.<name>`` with ``schedule`` only when BENCH_JOBS names it."""

    def register(func: Callable[..., Any]) -> Any:
        return job(name=f"bench.{name}", **schedule)(func) if name in ENABLED else func

    return register


@scheduled("every_second", cron="* * * * * *")
def every_second() -> dict[str, float]:
    return handler_started()


@scheduled("minutely", cron="* * * * *")
def minutely() -> dict[str, float]:
    return handler_started()


@job(name="bench.noop")
def noop() -> dict[str, float]:
    return handler_started()


@job(name="bench.long")
def long(ctx: RunContext) -> dict[str, float]:
    """Hold the run for BENCH_LONG seconds (default 90) so its node can be killed under it."""
    started = handler_started()
    deadline = time.monotonic() + float(os.environ.get("BENCH_LONG", "90"))
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.05)
    return started

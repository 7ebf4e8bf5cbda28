"""Jobs the tests run: each records its effect, so tests count executions, not just claims."""

import os
import time
from datetime import timedelta

from django_cluster_jobs import RunContext, job

from .models import Effect


def record(ctx: RunContext) -> None:
    Effect.objects.create(
        job=ctx.job, key=ctx.key, node=ctx.node_id, attempt=ctx.attempt, fence=ctx.fence
    )


# The scheduled test jobs are disabled unless a test process enables them by environment, so the
# in-process tests see a quiet registry and the multi-node tests choose what runs.
ENABLED = set(filter(None, os.environ.get("CLUSTER_JOBS_TEST_JOBS", "").split(",")))


@job(name="tests.every_second", cron="* * * * * *", enabled="every_second" in ENABLED)
def every_second(ctx: RunContext) -> None:
    record(ctx)


@job(name="tests.rate", every=timedelta(seconds=2), enabled="rate" in ENABLED)
def rate(ctx: RunContext) -> None:
    record(ctx)


@job(name="tests.delay", delay=timedelta(seconds=2), enabled="delay" in ENABLED)
def delay(ctx: RunContext) -> None:
    record(ctx)


@job(
    name="tests.per_node", cron="* * * * * *", placement="every_node", enabled="per_node" in ENABLED
)
def per_node(ctx: RunContext) -> None:
    record(ctx)


@job(name="tests.startup", startup=True, enabled="startup" in ENABLED)
def at_startup(ctx: RunContext) -> None:
    record(ctx)


@job(name="tests.slow", cron="* * * * * *", enabled="slow" in ENABLED)
def slow(ctx: RunContext) -> None:
    record(ctx)
    seconds = float(os.environ.get("CLUSTER_JOBS_TEST_SLOW", "3"))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    record(ctx)


@job(name="tests.manual")
def manual(ctx: RunContext, value: int = 0) -> int:
    record(ctx)
    return value * 2


@job(name="tests.boom")
def boom() -> None:
    raise RuntimeError("boom")


def _hold(ctx: RunContext) -> dict:
    """Record the start, work for CLUSTER_JOBS_TEST_LONG seconds ignoring cancel, record the end.

    Ignoring the cancel flag on purpose lets the fault tests show that fencing, not politeness,
    keeps a late writer out.
    """
    record(ctx)
    deadline = time.monotonic() + float(os.environ.get("CLUSTER_JOBS_TEST_LONG", "4"))
    while time.monotonic() < deadline:
        time.sleep(0.05)
    record(ctx)
    return {"node": ctx.node_id, "attempt": ctx.attempt}


@job(name="tests.long")
def long(ctx: RunContext) -> dict:
    return _hold(ctx)


@job(name="tests.long_once", delivery="at_most_once")
def long_once(ctx: RunContext) -> dict:
    return _hold(ctx)

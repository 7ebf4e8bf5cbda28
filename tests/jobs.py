"""Jobs the tests run: each records its effect, so tests count executions, not just claims."""

import os
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID

from django.conf import settings

from django_cluster_jobs import RunContext, job

from .models import Effect
from .timing import scaled

#: How often a test job that works for a while looks at its clock or at the ledger.
STEP = scaled(0.05)
#: How long a test job that must be stopped (by a cancel, a timeout or a kill) works at most: far
#: longer than any deadline a test gives the stopping.
UNTIL_STOPPED = scaled(120)


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
    seconds = scaled(float(os.environ.get("CLUSTER_JOBS_TEST_SLOW", "3")))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(STEP)
    record(ctx)


@job(name="tests.manual")
def manual(ctx: RunContext, value: int = 0) -> int:
    record(ctx)
    return value * 2


@job(name="tests.boom")
def boom() -> None:
    raise RuntimeError("boom")


def _hold(ctx: RunContext) -> dict:
    """Record the start, work for CLUSTER_JOBS_TEST_LONG (scaled) seconds ignoring cancel, record
    the end.

    Ignoring the cancel flag on purpose lets the fault tests show that fencing, not politeness,
    keeps a late writer out.
    """
    record(ctx)
    deadline = time.monotonic() + scaled(float(os.environ.get("CLUSTER_JOBS_TEST_LONG", "4")))
    while time.monotonic() < deadline:
        time.sleep(STEP)
    record(ctx)
    return {"node": ctx.node_id, "attempt": ctx.attempt}


@job(name="tests.long")
def long(ctx: RunContext) -> dict:
    return _hold(ctx)


@job(name="tests.long_once", delivery="at_most_once")
def long_once(ctx: RunContext) -> dict:
    return _hold(ctx)


# -- policies (retries, timeouts, overlap, tags) ------------------------------------------------


@job(name="tests.flaky", max_attempts=3, backoff={"kind": "exponential", "base": 10, "cap": 15})
def flaky(ctx: RunContext, succeed_on: int = 99) -> int:
    record(ctx)
    if ctx.attempt < succeed_on:
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return ctx.attempt


@job(name="tests.no_retry", max_attempts=3, dont_retry=(ValueError,))
def no_retry(ctx: RunContext) -> None:
    record(ctx)
    raise ValueError("bad input is never retried")


@job(name="tests.breaker", breaker_threshold=2, breaker_cooldown=timedelta(minutes=1))
def breaker(ctx: RunContext) -> None:
    raise RuntimeError("down")


@job(name="tests.polite", timeout=timedelta(seconds=0.3))
def polite(ctx: RunContext) -> str:
    """Sleeps up to 5 s (scaled) but stops as soon as it is cancelled."""
    record(ctx)
    ctx.wait(scaled(5))
    return "cancelled" if ctx.cancelled else "finished"


@job(name="tests.stubborn", timeout=timedelta(seconds=0.2))
def stubborn(ctx: RunContext) -> None:
    """Ignores cancellation for 3 s, scaled (a thread cannot be killed)."""
    time.sleep(scaled(3))


@job(name="tests.hang", executor="process", timeout=timedelta(seconds=1))
def hang(ctx: RunContext) -> None:
    """Hangs; the process executor kills it at its deadline."""
    time.sleep(UNTIL_STOPPED)


@job(name="tests.cancellable")
def cancellable(ctx: RunContext) -> str:
    record(ctx)
    ctx.wait(UNTIL_STOPPED)
    return "cancelled" if ctx.cancelled else "finished"


def _busy(ctx: RunContext, seconds: float = 2.5) -> None:
    record(ctx)
    ctx.wait(seconds)


@job(name="tests.overlap_skip", cron="* * * * * *", enabled="overlap_skip" in ENABLED)
def overlap_skip(ctx: RunContext) -> None:
    _busy(ctx)


@job(
    name="tests.overlap_allow",
    cron="* * * * * *",
    overlap="allow",
    enabled="overlap_allow" in ENABLED,
)
def overlap_allow(ctx: RunContext) -> None:
    _busy(ctx)


@job(
    name="tests.overlap_buffer",
    cron="* * * * * *",
    overlap="buffer_one",
    enabled="overlap_buffer" in ENABLED,
)
def overlap_buffer(ctx: RunContext) -> None:
    _busy(ctx)


@job(
    name="tests.overlap_cancel",
    cron="* * * * * *",
    overlap="cancel_other",
    enabled="overlap_cancel" in ENABLED,
)
def overlap_cancel(ctx: RunContext) -> None:
    _busy(ctx, 30)


@job(
    name="tests.concurrent",
    cron="* * * * * *",
    overlap="allow",
    max_concurrency=2,
    enabled="concurrent" in ENABLED,
)
def concurrent(ctx: RunContext) -> None:
    _busy(ctx, 3.5)


@job(name="tests.gpu", cron="* * * * * *", requires={"gpu"}, enabled="gpu" in ENABLED)
def gpu(ctx: RunContext) -> None:
    record(ctx)


# Misfire policies after an outage (tests/multinode/test_misfire.py). Overlap is "allow" so the
# test measures catch-up alone; the catch-up lane of overlap="skip" jobs is tested in-process.
@job(
    name="tests.misfire_once",
    every=timedelta(seconds=2),
    overlap="allow",
    enabled="misfire_once" in ENABLED,
)
def misfire_once(ctx: RunContext) -> None:
    record(ctx)


@job(
    name="tests.misfire_skip",
    every=timedelta(seconds=2),
    overlap="allow",
    misfire="skip",
    enabled="misfire_skip" in ENABLED,
)
def misfire_skip(ctx: RunContext) -> None:
    record(ctx)


@job(
    name="tests.misfire_all",
    every=timedelta(seconds=2),
    overlap="allow",
    misfire="run_all",
    catch_up_limit=3,
    enabled="misfire_all" in ENABLED,
)
def misfire_all(ctx: RunContext) -> None:
    record(ctx)


@job(
    name="tests.queue_a",
    cron="* * * * * *",
    overlap="allow",
    queue="limited",
    enabled="queue_a" in ENABLED,
)
def queue_a(ctx: RunContext) -> None:
    _busy(ctx, 3.5)


@job(
    name="tests.queue_b",
    cron="* * * * * *",
    overlap="allow",
    queue="limited",
    enabled="queue_b" in ENABLED,
)
def queue_b(ctx: RunContext) -> None:
    _busy(ctx, 3.5)


@job(name="tests.pair", overlap="allow", max_concurrency=2)
def pair(ctx: RunContext) -> None:
    _busy(ctx, 1.5)


# -- containment: odd results, odd text, async handlers, exits ----------------------------------

ODD = {
    "datetime": lambda: datetime(2026, 5, 28, 9, 0, tzinfo=UTC),
    "decimal": lambda: Decimal("1.50"),
    "uuid": lambda: UUID("12345678-1234-5678-1234-567812345678"),
    "nul": lambda: "before\x00after",
    "nan": lambda: float("nan"),
    "object": lambda: object(),
    "nested": lambda: {"when": [Decimal("2")], "text": "a\x00b"},
}


@job(name="tests.odd_result")
def odd_result(ctx: RunContext, kind: str = "datetime"):
    """Return a value the plain JSON encoder cannot store."""
    record(ctx)
    return ODD[kind]()


@job(name="tests.nul_error")
def nul_error(ctx: RunContext) -> None:
    record(ctx)
    raise RuntimeError("bad\x00text")


@job(name="tests.exits")
def exits(ctx: RunContext) -> None:
    record(ctx)
    raise SystemExit(3)


@job(name="tests.async_job")
async def async_job(ctx: RunContext, seconds: float = 0.01) -> str:
    import asyncio

    from asgiref.sync import sync_to_async

    await sync_to_async(record)(ctx)
    await asyncio.sleep(seconds)
    return "awaited"


def _chat(ctx: RunContext, lines: int, fail_first: bool) -> None:
    ctx.logger.debug("not stored at the default level")
    ctx.logger.info("attempt %s starts", ctx.attempt)
    for n in range(lines):
        ctx.logger.info("line %d", n)
    try:
        raise KeyError("missing")
    except KeyError:
        ctx.logger.exception("caught %s", "it")
    ctx.logger.warning("done")
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("first attempt fails")


@job(name="tests.chatty", max_attempts=2, backoff={"kind": "fixed", "base": 0})
def chatty(ctx: RunContext, lines: int = 0, fail_first: bool = False) -> str:
    """Logs through ctx.logger: debug, info with arguments, an exception, a warning."""
    _chat(ctx, lines, fail_first)
    return "chatted"


@job(name="tests.chatty_async")
async def chatty_async(ctx: RunContext, lines: int = 0) -> str:
    """The same from an async handler."""
    _chat(ctx, lines, False)
    return "chatted"


@job(name="tests.chatty_process", executor="process", timeout=timedelta(seconds=120))
def chatty_process(ctx: RunContext, lines: int = 0, hang: bool = False) -> str:
    """The same in a child process; with ``hang`` it then waits to be killed."""
    _chat(ctx, lines, False)
    if hang:
        time.sleep(UNTIL_STOPPED)
    return "chatted"


@job(name="tests.sleepy")
def sleepy(ctx: RunContext, seconds: float = 1.0) -> None:
    """Sleeps, deaf to cancellation, then returns (its end may come after it lost the run)."""
    time.sleep(seconds)


# -- dependencies: a workflow (root, then b and c in parallel, then d after both) ---------------


@job(name="tests.flow_root", every=timedelta(seconds=1), enabled="flow" in ENABLED)
def flow_root(ctx: RunContext) -> None:
    record(ctx)


def _together(ctx: RunContext) -> None:
    """Record, then wait until the other branch of the same instance runs too, so both end at
    the same instant (on two nodes, or two threads of one)."""
    record(ctx)
    deadline = time.monotonic() + scaled(float(os.environ.get("CLUSTER_JOBS_TEST_LONG", "0")))
    branches = Effect.objects.filter(key=ctx.key, job__in=("tests.flow_b", "tests.flow_c"))
    while time.monotonic() < deadline + scaled(5) and branches.count() < 2:
        time.sleep(STEP)
    while time.monotonic() < deadline:
        time.sleep(STEP)
    if Effect.objects.filter(job=f"fail:{ctx.job}").exists():  # a test asks it to fail
        raise RuntimeError(f"{ctx.job} fails on purpose")


@job(name="tests.flow_b", after=[flow_root])
def flow_b(ctx: RunContext) -> None:
    _together(ctx)


@job(name="tests.flow_c", after=["tests.flow_root"])
def flow_c(ctx: RunContext) -> None:
    _together(ctx)


@job(name="tests.flow_d", after=[flow_b, flow_c])
def flow_d(ctx: RunContext) -> None:
    record(ctx)


# -- exactly once -------------------------------------------------------------------------------


def _moved_fence(run_id: int) -> None:
    """Move the run's fence from a connection of another thread, committed, as a takeover
    does while this attempt still runs."""
    import threading

    from django.db import connections
    from django.db.models import F

    from django_cluster_jobs.models import JobRun

    def bump() -> None:
        try:
            JobRun.objects.filter(pk=run_id).update(fence=F("fence") + 1)
        finally:
            connections.close_all()

    other = threading.Thread(target=bump)
    other.start()
    other.join()


#: Exactly-once needs the ledger on the default database (cluster_jobs.E040): the test settings
#: that put it elsewhere (tests/settings_ledger.py) declare no such job.
LEDGER_ELSEWHERE = settings.CLUSTER_JOBS.get("DATABASE", "default") != "default"


def effects_once(ctx: RunContext, fail_until: int = 0, enqueue: bool = False,
                 taken_over: bool = False, swallow: bool = False) -> int:  # fmt: skip
    """Write two rows and end; up to attempt ``fail_until``, fail after the first.

    ``enqueue``: queue a run of tests.manual from inside; ``taken_over``: the fence moves before
    the end; ``swallow``: catch a database error without a savepoint."""
    import contextlib

    from django.db import IntegrityError

    from django_cluster_jobs import services

    record(ctx)
    if enqueue:
        services.enqueue("tests.manual", {"value": ctx.attempt}, key=f"inner-{ctx.key}")
    if ctx.attempt <= fail_until:
        raise RuntimeError(f"attempt {ctx.attempt} fails half-way")
    if taken_over:
        _moved_fence(ctx.run_id)
    if swallow:  # on PostgreSQL the transaction is then unusable: the end cannot commit
        with contextlib.suppress(IntegrityError):
            Effect.objects.create(id=Effect.objects.get(key=ctx.key).pk, job="x", key="x", node="x")
        return ctx.attempt
    record(ctx)
    return ctx.attempt


def effects_slow(ctx: RunContext) -> int:
    """Write a row, work a while, write a second: an attempt killed between them must leave
    neither."""
    record(ctx)
    time.sleep(scaled(0.4))
    record(ctx)
    return ctx.attempt


if not LEDGER_ELSEWHERE:
    job(name="tests.effects_slow", delivery="exactly_once", timeout=timedelta(seconds=5),
        max_attempts=5)(effects_slow)  # fmt: skip
    job(name="tests.effects_once", delivery="exactly_once", timeout=timedelta(seconds=5),
        max_attempts=2, backoff={"kind": "fixed", "base": 0})(effects_once)  # fmt: skip

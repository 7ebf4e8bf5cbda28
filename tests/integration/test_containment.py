"""Nothing a stored row, a run's data or a handler's return value can be stops a node.

Each test stores what a user, an operator or an older version could have stored (bypassing the
validator, as rows written before it existed do) and checks that the failure stays at that job's
or that run's boundary, recorded with its reason, while every other job goes on.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from django_cluster_jobs import services
from django_cluster_jobs.engine import Node
from django_cluster_jobs.engine.registration import sync_definitions
from django_cluster_jobs.engine.runner import Stop
from django_cluster_jobs.models import JobDefinition, JobRun, RunState, Source
from django_cluster_jobs.registry import registry
from tests import timing
from tests.conftest import wait_until
from tests.factories import JobDefinitionFactory, JobRunFactory
from tests.models import Effect
from tests.nodes import is_ended, served, take_all
from tests.raw_rows import store_deep_json, store_raw

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def node():
    node = Node("contained", threads=3)
    node.start()
    yield node
    node.stop()


def ended(run: JobRun, timeout: float) -> JobRun:
    wait_until(lambda: is_ended(run), timeout)
    return JobRun.objects.get(pk=run.pk)


#: How long another process holds SQLite's writer lock while a node registers: longer than a
#: healthy node takes from its start to its registration's first write.
WRITER_HOLDS = timing.scaled(3)


# -- stored definitions ----------------------------------------------------------------------

POISON = {
    "cron 61": {"cron": "61 * * * *"},
    "mars": {"cron": "* * * * *", "timezone": "Mars/Olympus"},
    "null interval": {"schedule_kind": "every", "cron": "", "interval": None},
    "huge interval": {"schedule_kind": "every", "cron": "", "interval": timedelta(days=3_000_000)},
    "list payload": {"cron": "* * * * *", "payload": [1, 2]},
}


@pytest.mark.parametrize("poison", POISON)
@pytest.mark.timing
def test_a_definition_row_the_node_cannot_use_is_skipped_and_named(node, caplog, poison):
    """9.2: such a row used to stop every node at its next reload."""
    JobDefinitionFactory(name=f"bad-{poison}", callable_name="tests.manual", **POISON[poison])
    with caplog.at_level(logging.ERROR, logger="django_cluster_jobs"):
        node.reload()
        node.tick()
    assert f"bad-{poison}" not in node.planned and "tests.manual" in node.planned
    messages = [r.getMessage() for r in caplog.records if f"bad-{poison}" in r.getMessage()]
    assert messages and all("is not planned" in message for message in messages), messages
    ok = services.enqueue("tests.manual", {"value": 2})
    assert served(node, ok).state == RunState.SUCCEEDED


#: Per database, values a column holds that Python cannot read back: a timestamp beyond
#: datetime (PostgreSQL's infinity), an interval beyond timedelta, text that is no date.
BEYOND_PYTHON = {
    "postgresql": {
        "infinite pause": ("paused_until", "CAST('infinity' AS timestamptz)"),
        "interval beyond timedelta": ("interval", "CAST('2000000000 days' AS interval)"),
    },
    "sqlite": {
        "no date": ("paused_until", "'not a date'"),
        "no interval": ("interval", "'ten minutes'"),
    },
}


@pytest.mark.parametrize("case", ["infinite pause", "interval beyond timedelta", "no date",
                                  "no interval", "deep payload", "deep after"])  # fmt: skip
@pytest.mark.timing
def test_a_definition_python_cannot_read_is_left_out_once_and_the_others_run(node, caplog, case):
    """Item 1 of the second containment round: such a row made every node loop on a failing
    tick, running nothing for any job, and every restart exit."""
    bad = JobDefinitionFactory(name=f"bad-{case}", callable_name="tests.manual",
                               schedule_kind="every", cron="",
                               interval=timedelta(minutes=10))  # fmt: skip
    if case.startswith("deep"):
        store_deep_json(JobDefinition, bad.pk, case.split()[1])
    else:
        holds = BEYOND_PYTHON.get(connection.vendor, {})
        if case not in holds:
            pytest.skip(f"{connection.vendor} holds no such value (it refuses it at the write)")
        store_raw(JobDefinition, bad.pk, *holds[case])
    with caplog.at_level(logging.ERROR, logger="django_cluster_jobs"):
        node.reload()
        node.tick()
        node.reload()  # logged once, not at every load
        node.tick()
    assert bad.name not in node.planned and "tests.manual" in node.planned
    said = [r.getMessage() for r in caplog.records if bad.name in r.getMessage()]
    assert len(said) == 1, said
    assert "not planned" in said[0]
    ok = services.enqueue("tests.manual", {"value": 3})
    assert served(node, ok).state == RunState.SUCCEEDED


# -- stored runs -----------------------------------------------------------------------------


@pytest.mark.timing
def test_a_pending_run_whose_payload_python_cannot_read_fails_once_with_its_reason(node):
    """Item 5: such a run stayed pending for ever, and its failing take held up every other."""
    job = JobDefinition.objects.get(name="tests.manual")
    poison = JobRunFactory(job=job, key="deep", state=RunState.PENDING)
    store_deep_json(JobRun, poison.pk, "payload")
    ok = services.enqueue("tests.manual", {"value": 1})
    poison = served(node, poison)
    assert poison.state == RunState.FAILED and poison.attempt == 1
    assert "unreadable JSON: nested 900 levels deep, more than 500" in poison.error
    assert served(node, ok).state == RunState.SUCCEEDED
    assert not Effect.objects.filter(key="deep").exists()


@pytest.mark.timing
def test_a_pending_run_whose_payload_is_not_an_object_fails_once_with_its_reason(node):
    """9.6: it used to take the nodes down one by one."""
    job = JobDefinition.objects.get(name="tests.manual")
    poison = JobRunFactory(job=job, key="poison", state=RunState.PENDING, payload=[1, 2])
    ok = services.enqueue("tests.manual", {"value": 1})
    poison = served(node, poison)
    assert poison.state == RunState.FAILED and "InvalidPayload" in poison.error
    assert "not a JSON object" in poison.error and poison.attempt == 1
    assert served(node, ok).state == RunState.SUCCEEDED
    assert not Effect.objects.filter(key="poison").exists()


@pytest.mark.parametrize(
    ("priority", "due"),
    [(2_000_000_000, None), (1, datetime(1, 1, 1, tzinfo=UTC)), (-2_000_000_000, None)],
    ids=["huge priority", "year 1", "huge negative"],
)
def test_a_pending_run_with_an_odd_priority_or_due_time_is_taken_with_the_others(
    ledger, priority, due
):
    """9.1: the take used to overflow, and with it every take of every job."""
    job = JobDefinitionFactory(callable_name="tests.manual")
    now = datetime.now(UTC)
    odd = JobRunFactory(job=job, key="odd", state=RunState.PENDING, priority=priority,
                        due_at=due or now)  # fmt: skip
    normal = JobRunFactory(job=job, key="normal", state=RunState.PENDING, due_at=now)
    taken = ledger.vendor.take_pending("n", [job.pk], 5, now, now + timedelta(seconds=30))
    assert {w.run_id for w in taken} == {odd.pk, normal.pk}


# -- what handlers return and raise ----------------------------------------------------------

STORED = {
    "datetime": "2026-05-28T09:00:00Z",
    "decimal": "1.50",
    "uuid": "12345678-1234-5678-1234-567812345678",
    "nul": "before\ufffdafter",
    "nested": {"when": ["2"], "text": "a\ufffdb"},
}


@pytest.mark.parametrize("kind", [*STORED, "nan", "object"])
@pytest.mark.timing
def test_an_odd_return_value_is_stored_safely_and_the_run_ends_once(node, kind):
    """9.4: the completion write used to raise, and the successful run was re-run."""
    run = served(node, services.enqueue("tests.odd_result", {"kind": kind}))
    assert (run.state, run.attempt) == (RunState.SUCCEEDED, 1)
    if kind in STORED:
        assert run.result == STORED[kind]
    else:
        assert isinstance(run.result, str) and run.result.startswith(("nan", "<object"))
    assert Effect.objects.filter(key=run.key).count() == 1


@pytest.mark.timing
def test_error_text_with_a_nul_is_stored_and_the_run_fails_once(node):
    run = served(node, services.enqueue("tests.nul_error"))
    assert (run.state, run.attempt) == (RunState.FAILED, 1)
    assert run.error == "RuntimeError: bad\ufffdtext" and "Traceback" in run.traceback


@pytest.mark.timing
def test_a_handler_that_exits_fails_and_its_thread_serves_on(node):
    runs = [services.enqueue("tests.exits") for _ in range(node.executor.threads + 1)]
    # One run more than threads: the last runs only on a thread that served an exit before.
    assert {served(node, run).state for run in runs} == {RunState.FAILED}
    assert JobRun.objects.filter(pk=runs[0].pk, error__startswith="SystemExit").exists()
    # A thread is free again once its run's end is written and it returns to the pool.
    wait_until(lambda: node.executor.free == node.executor.threads, timing.REACT)


@pytest.mark.timing
def test_an_async_handler_is_awaited(node):
    """9.8: it used to be recorded succeeded without running."""
    run = served(node, services.enqueue("tests.async_job"))
    assert (run.state, run.result) == (RunState.SUCCEEDED, "awaited")
    assert Effect.objects.filter(key=run.key).count() == 1


@pytest.mark.timing
def test_cancelling_an_async_handler_cancels_its_task(node):
    run = services.enqueue("tests.async_job", {"seconds": 3 * timing.REACT})  # outlasts waits
    started = Effect.objects.filter(key=run.key)
    wait_until(lambda: take_all(node) or started.exists(), timing.REACT)
    node.runner.cancel({run.pk}, why=Stop.CANCEL)
    run = ended(run, timeout=timing.REACT)  # its task is cancelled at its next await
    assert run.state == RunState.CANCELLED and "CancelledError" in run.error


@pytest.mark.timing
def test_a_failing_handler_logs_its_traceback_with_the_job_occurrence_and_run(node, caplog):
    with caplog.at_level(logging.ERROR, logger="django_cluster_jobs"):
        run = served(node, services.enqueue("tests.boom"))
    [record] = [r for r in caplog.records if getattr(r, "run_id", None) == run.pk]
    assert record.levelname == "ERROR" and record.job == "tests.boom"
    assert record.occurrence == run.key and "Traceback" in record.getMessage()
    assert "RuntimeError: boom" in record.getMessage()


# -- background threads and chores -----------------------------------------------------------


def test_a_dead_heartbeat_thread_is_restarted_and_one_that_keeps_dying_stops_the_node(
    node, monkeypatch
):
    def dies(self):
        """The thread's body ends at once, as after an exception nothing caught."""

    node.heartbeat.stop()
    node.heartbeat.join(timing.REACT)  # a stopped thread ends at its next wait
    node.tick()
    assert node.heartbeat.is_alive() and node.restarts["heartbeat"] == 1
    node.heartbeat.stop()
    monkeypatch.setattr(type(node.heartbeat), "run", dies)
    for _ in range(4):
        node.heartbeat.join(timing.REACT)
        node.tick()
    assert node.failure == "the heartbeat thread kept dying" and node.stopping


@pytest.mark.timing
def test_a_chore_that_fails_leaves_the_other_chores_and_the_heartbeat_running(
    node, monkeypatch, caplog
):
    """9.3: an overflowing purge used to kill the heartbeat thread of every leader."""
    from django_cluster_jobs.models import WorkerNode
    from tests.factories import WorkerNodeFactory

    def overflows(now, keep):
        raise OverflowError("date value out of range")

    wait_until(lambda: node.leader.held is not None, timing.REACT)  # the only node leads
    monkeypatch.setattr(node.ledger.chores, "purge", overflows)
    WorkerNodeFactory(node_id="silent", last_heartbeat=node.clock.now() - timedelta(hours=1))
    node.leader._last_purge = None
    with caplog.at_level(logging.ERROR, logger="django_cluster_jobs"):
        assert node.leader.chores(node.clock.now())
    assert WorkerNode.objects.get(node_id="silent").status == "dead", "the next chore ran"
    assert any("leader chore purge" in r.getMessage() for r in caplog.records)
    assert node.heartbeat.is_alive()


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's writer lock, not PostgreSQL")
@pytest.mark.timing
def test_a_node_starting_while_another_process_writes_waits_for_the_database():
    """9.11: registration used to crash with "database is locked"."""
    late = Node("late-starter", threads=1)
    db = sqlite3.connect(
        connection.settings_dict["NAME"], isolation_level=None, check_same_thread=False
    )
    db.execute("BEGIN IMMEDIATE")
    releasing = threading.Event()

    def release_the_writer_lock() -> None:
        releasing.set()  # before the ROLLBACK: nothing can write until it has run
        db.execute("ROLLBACK")

    release = threading.Timer(WRITER_HOLDS, release_the_writer_lock)
    release.start()
    try:
        late.register()
        assert releasing.is_set(), "registered while another process held the writer lock"
    finally:
        release.join()
        db.close()
        late.executor.shutdown()


def test_a_code_job_never_takes_over_an_operators_job_of_the_same_name(caplog):
    """9.12: the operator's row keeps its schedule and its source."""
    JobDefinitionFactory(name="tests.every_second", callable_name="tests.manual",
                         cron="0 3 * * *", source=Source.DATABASE)  # fmt: skip
    with caplog.at_level(logging.ERROR, logger="django_cluster_jobs"):
        sync_definitions(registry, "default")
    row = JobDefinition.objects.get(name="tests.every_second")
    kept = (row.source, row.callable_name, row.cron)
    assert kept == (Source.DATABASE, "tests.manual", "0 3 * * *")
    assert any("an operator's database job has that name" in r.getMessage() for r in caplog.records)

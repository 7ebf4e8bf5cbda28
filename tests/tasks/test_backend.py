"""The django.tasks backend as Django documents a backend: enqueue, results, statuses, errors,
retries, async tasks, defer and priority, run by a real in-process Node."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from django_cluster_jobs.engine.node import Node
from django_cluster_jobs.exceptions import InvalidPayload
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from django_cluster_jobs.tasks import ClusterJobsBackend
from django_cluster_jobs.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests import task_defs, timing
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: Longest wait for a node to finish a task (a busy two-core machine).
DEADLINE = timing.RUN_ENDS


def run_then_close(node: Node) -> None:
    """Run ``node`` on this thread until it is asked to stop, or longer than any wait on it."""
    try:
        node.run(duration=timing.PROCESS_LIFE)
    finally:
        connections.close_all()


class Running:
    """A Node looping on a thread of this process; stopped (and joined) at teardown."""

    def __init__(self, node_id: str = "tasks-node") -> None:
        self.node = Node(node_id, threads=2)
        self.thread = threading.Thread(target=run_then_close, args=(self.node,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.node.request_stop("test over")
        self.thread.join(timeout=timing.NODE_EXIT)
        assert not self.thread.is_alive(), "the node did not stop"


@pytest.fixture
def node() -> Iterator[Running]:
    running = Running()
    yield running
    running.close()


def finished(result):
    """Wait until the task's result has finished; return it refreshed."""

    def done():
        result.refresh()
        return result.is_finished

    wait_until(done, DEADLINE)
    return result


def test_backend_says_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, ClusterJobsBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_enqueue_stores_a_ready_run_with_its_args():
    result = task_defs.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.attempts == 0 and result.worker_ids == [] and result.errors == []
    run = JobRun.objects.get(pk=int(result.id))
    assert (run.task_path, run.args, run.kwargs) == ("tests.task_defs.add", [2], {"b": 3})
    assert run.state == RunState.PENDING and run.job.name == "tests.task_defs.add"
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value


def test_an_enqueue_is_one_statement():
    """As for any one-off run: the INSERT reads the task's job definition itself (and carries
    the notification on PostgreSQL), once the first call has stored the definition."""
    from django.db import connection

    from django_cluster_jobs.coordination import get_vendor

    task_defs.add.enqueue(1)
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        result = task_defs.add.enqueue(2, b=3)
    expected = 1 if get_vendor().features.inserts_pending else 2
    assert len(sent) == expected, sent
    run = JobRun.objects.get(pk=int(result.id))
    assert (run.args, run.kwargs, run.priority) == ([2], {"b": 3}, task_defs.add.priority)


@pytest.mark.timing
def test_run_by_a_node_succeeds_with_its_return_value(node):
    result = finished(task_defs.add.enqueue(2, b=3))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and result.worker_ids == ["tasks-node"]
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    again = task_defs.add.get_result(result.id)
    assert again.return_value == 5 and again.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.timing
def test_a_run_taken_once_reads_as_its_stored_timeline_says(node):
    """The result of a task run once is built from its row alone; it is the one its stored
    timeline gives."""
    from django_cluster_jobs.models import RunEvent
    from django_cluster_jobs.tasks.results import result_of, timeline_of

    result = finished(task_defs.add.enqueue(2, b=3))
    run = JobRun.objects.get(pk=int(result.id))
    stored = list(RunEvent.objects.filter(run_id=run.pk).order_by("at", "id"))
    [start] = timeline_of(run)  # no query
    assert [(e.kind, e.node, e.at) for e in stored if e.kind == start.kind] == [
        (start.kind, start.node, start.at)
    ]
    full, short = result_of(run, task_defs.add, stored), result_of(run, task_defs.add)
    fields = ("status", "started_at", "last_attempted_at", "finished_at", "worker_ids", "errors")
    assert [getattr(short, f) for f in fields] == [getattr(full, f) for f in fields]


@pytest.mark.timing
def test_failure_is_failed_with_its_error(node):
    result = finished(task_defs.fails.enqueue("no luck"))
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "tests.task_defs.Boom"
    assert error.exception_class is task_defs.Boom
    assert "no luck" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value


@pytest.mark.timing
def test_a_return_value_that_is_not_json_fails_the_task(node):
    result = finished(task_defs.unjsonable.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError


@pytest.mark.timing
def test_retry_is_ready_then_successful(node, tmp_path):
    marker = tmp_path / "flaky"
    result = task_defs.flaky.enqueue(str(marker))
    wait_until(lambda: marker.exists(), DEADLINE)

    def retried():
        result.refresh()
        return result.status == TaskResultStatus.READY and result.errors

    # The first attempt failed: the run waits for its retry, READY, with that attempt's error.
    seen_ready = wait_until(lambda: retried() or result.is_finished, DEADLINE)
    assert seen_ready
    finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "second"
    assert result.attempts == 2 and result.worker_ids == ["tasks-node", "tasks-node"]
    assert [e.exception_class_path for e in result.errors] == ["tests.task_defs.Boom"]
    assert JobDefinition.objects.get(name="tests.task_defs.flaky").max_attempts == 2


@pytest.mark.timing
def test_async_task_really_runs(node):
    result = finished(task_defs.async_add.enqueue(20, 22))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42


@pytest.mark.timing
def test_takes_context_receives_the_task_result(node):
    result = finished(task_defs.with_context.enqueue(label="x"))
    assert result.return_value == {"label": "x", "attempt": 1, "id": result.id}


@pytest.mark.timing
def test_aenqueue_and_aget_result(node):
    from asgiref.sync import async_to_sync

    async def roundtrip():
        enqueued = await task_defs.add.aenqueue(1, 1)
        return enqueued, await task_defs.add.aget_result(enqueued.id)

    enqueued, got = async_to_sync(roundtrip)()
    assert got.id == enqueued.id and got.args == [1, 1]
    assert finished(got).return_value == 2


@pytest.mark.timing
def test_run_after_defers_the_run(node):
    later = timezone.now() + timedelta(seconds=2)
    result = finished(task_defs.add.using(run_after=later).enqueue(1))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.started_at >= later


@pytest.mark.timing
def test_priority_orders_due_runs():
    """Larger priority runs sooner: three due runs taken by one node with one thread."""
    low = task_defs.add.using(priority=-10).enqueue(1)
    high = task_defs.add.using(priority=50).enqueue(2)
    mid = task_defs.add.enqueue(3)
    assert JobRun.objects.get(pk=int(high.id)).priority == 50
    node = Node("one-thread", threads=1)
    worker = threading.Thread(target=run_then_close, args=(node,))
    worker.start()
    try:
        for result in (low, high, mid):
            finished(result)
    finally:
        node.request_stop("test over")
        worker.join(timeout=timing.NODE_EXIT)
    order = sorted((low, high, mid), key=lambda r: r.started_at)
    assert order == [high, mid, low]


@pytest.mark.timing
def test_signals_are_sent(node):
    seen: list[tuple[str, str]] = []

    def receiver(name):
        def receive(sender, task_result, **kwargs):
            seen.append((name, task_result.status))

        return receive

    receivers = [
        (sig, receiver(name))
        for sig, name in (
            (task_enqueued, "enqueued"),
            (task_started, "started"),
            (task_finished, "finished"),
        )
    ]
    for sig, fn in receivers:
        sig.connect(fn)
    try:
        finished(task_defs.add.enqueue(1))
        wait_until(lambda: len(seen) == 3, DEADLINE)
    finally:
        for sig, fn in receivers:
            sig.disconnect(fn)
    assert seen == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]


@pytest.mark.timing
def test_the_finished_signal_carries_the_result_as_stored(node):
    """task_finished's result of a success is built from the run's start and the end its node
    wrote, without reading the row again: it is the result get_result reads."""
    seen = []

    def receive(sender, task_result, **kwargs):
        seen.append(task_result)

    task_finished.connect(receive)
    try:
        result = finished(task_defs.add.enqueue(4, b=5))
        wait_until(lambda: seen, DEADLINE)
    finally:
        task_finished.disconnect(receive)
    [sent] = seen
    stored = task_defs.add.get_result(result.id)
    fields = ("id", "status", "args", "kwargs", "enqueued_at", "started_at", "finished_at",
              "last_attempted_at", "worker_ids", "errors", "return_value")  # fmt: skip
    assert [getattr(sent, f) for f in fields] == [getattr(stored, f) for f in fields]


def test_get_result_of_another_task_is_a_mismatch_and_unknown_ids_do_not_exist():
    result = task_defs.add.enqueue(1)
    with pytest.raises(TaskResultMismatch):
        task_defs.echo.get_result(result.id)
    for unknown in ("999999", "not-a-number"):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(unknown)


def test_queue_and_priority_are_validated():
    with pytest.raises(InvalidTask, match="Queue"):
        task_defs.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTask):
        task_defs.add.using(priority=101)
    with pytest.raises(InvalidTask, match="aware"):
        task_defs.add.using(run_after=timezone.now().replace(tzinfo=None))


def test_arguments_that_are_not_json_are_refused_and_nothing_is_stored():
    before = JobRun.objects.count()
    with pytest.raises(TypeError):
        task_defs.add.enqueue(object())
    with pytest.raises(InvalidPayload, match="NUL"):
        task_defs.add.enqueue("\x00")
    assert JobRun.objects.count() == before


@pytest.mark.timing
def test_a_dead_lettered_task_replays_with_its_arguments(node, tmp_path):
    from django_cluster_jobs import services

    failed = finished(task_defs.fails.enqueue("again"))
    fresh = services.replay(JobRun.objects.get(pk=int(failed.id)), by="operator")
    assert (fresh.task_path, fresh.args, fresh.kwargs) == ("tests.task_defs.fails", ["again"], {})
    replayed = finished(task_defs.fails.get_result(str(fresh.pk)))
    assert replayed.status == TaskResultStatus.FAILED and replayed.id != failed.id
    assert "again" in replayed.errors[0].traceback


@pytest.mark.timing
def test_a_task_past_its_timeout_is_failed(node):
    result = finished(task_defs.overruns.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1 and result.attempts == 1
    run = JobRun.objects.get(pk=int(result.id))
    assert run.state == RunState.TIMED_OUT


def test_the_resolver_imports_only_tasks_inside_installed_apps():
    from django_cluster_jobs.registry import registry
    from django_cluster_jobs.tasks.jobs import NOT_IMPORTABLE, resolve

    assert resolve("tests.task_defs.add").task is task_defs.add
    assert resolve("tests.task_defs.Boom") is None  # importable, not a task
    assert resolve("json.dumps") is None and resolve("nowhere") is None  # not in an app
    assert "json.dumps" not in registry
    assert resolve("tests.no_such_module.task") is None
    assert "tests.no_such_module.task" in NOT_IMPORTABLE  # not searched for again

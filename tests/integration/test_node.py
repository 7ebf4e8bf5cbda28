"""The node loop in process: fail-closed claims, batch sizes, capacity, startup jobs."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, transaction

from django_cluster_jobs.coordination import get_coordinator
from django_cluster_jobs.engine import Node
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from tests.conftest import wait_until
from tests.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


class FlakyCoordinator:
    """Delegates to a real coordinator; ``claim`` raises while ``down`` is set."""

    def __init__(self) -> None:
        self.real = get_coordinator()
        self.down = False

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def claim(self, *args, **kwargs):
        if self.down:
            raise OperationalError("could not connect to server: Connection refused")
        return self.real.claim(*args, **kwargs)


@pytest.fixture
def node():
    coordinator = FlakyCoordinator()
    node = Node("in-process", coordinator=coordinator, threads=2)
    node.start()
    JobDefinition.objects.filter(name="tests.every_second").update(enabled=True)
    node.reload()
    yield node
    node.stop()


def fire(node: Node, name: str) -> None:
    """Make ``name`` due now and run one tick."""
    node.planner.clear()
    node.planner.push(node.clock.now().replace(microsecond=0), name)
    node.tick()


def test_a_failed_claim_skips_the_occurrence_and_the_loop_survives(node, caplog):
    node.coordinator.down = True
    with caplog.at_level(logging.WARNING, logger="django_cluster_jobs"):
        fire(node, "tests.every_second")
    assert not JobRun.objects.exists()
    assert node.counters.skipped["claim_failed"] == 1
    [record] = [r for r in caplog.records if "fail-closed" in r.getMessage()]
    assert "tests.every_second @ " in record.getMessage() and record.job == "tests.every_second"

    node.coordinator.down = False
    fire(node, "tests.every_second")
    wait_until(lambda: JobRun.objects.filter(state=RunState.SUCCEEDED).exists(), timeout=10)
    assert Effect.objects.count() == 1


def test_a_full_executor_skips_instead_of_claiming(node):
    blockers = [threading.Event() for _ in range(2)]
    for event in blockers:
        assert node.executor.submit(lambda e=event: e.wait(10))
    try:
        fire(node, "tests.every_second")
        assert not JobRun.objects.exists()
        assert node.counters.skipped["node_busy"] == 1
    finally:
        for event in blockers:
            event.set()


def test_a_disabled_job_is_skipped_with_its_reason(node):
    JobDefinition.objects.filter(name="tests.every_second").update(enabled=False)
    node.reload()
    fire(node, "tests.every_second")
    assert not JobRun.objects.exists()
    assert node.counters.skipped["disabled"] == 1


def test_handler_failure_is_recorded_with_traceback(node):
    JobDefinition.objects.filter(name="tests.boom").update(
        schedule_kind="every", interval=timedelta(seconds=1)
    )
    node.reload()
    fire(node, "tests.boom")
    run = wait_until(
        lambda: JobRun.objects.filter(job__name="tests.boom", state=RunState.FAILED).first(),
        timeout=10,
    )
    assert run.error == "RuntimeError: boom" and "Traceback" in run.traceback


def test_an_edit_stamped_older_than_the_newest_row_is_still_noticed(node):
    from datetime import UTC, datetime

    before = node.coordinator.definitions_version()
    old = datetime(2000, 1, 1, tzinfo=UTC)
    JobDefinition.objects.filter(name="tests.manual").update(updated_at=old)
    assert node.coordinator.definitions_version() != before


def test_a_definition_saved_while_the_node_starts_is_picked_up():
    from django_cluster_jobs.engine.node import sync_definitions
    from tests.factories import JobDefinitionFactory

    late = Node("late", threads=1)
    late.register()
    sync_definitions(late.registry, late.coordinator.alias)
    late.heartbeat.prime()
    late.reload()
    JobDefinitionFactory(name="saved-during-start", callable_name="tests.manual")
    late.heartbeat.beat()  # the first heartbeat sees the change...
    late.tick()  # ...and the next tick re-plans with it
    try:
        assert "saved-during-start" in late.planned
    finally:
        late.stop()


def test_due_pending_work_it_cannot_take_does_not_spin_the_loop(node):
    from django_cluster_jobs import services

    blockers = [threading.Event() for _ in range(2)]
    for event in blockers:
        assert node.executor.submit(lambda e=event: e.wait(10))
    try:
        services.enqueue("tests.manual")
        node.wake_pending()
        node.tick()
        now = node.clock.now()
        assert node._pending_due > now + timedelta(seconds=0.5), "the loop would spin"
        assert JobRun.objects.get(job__name="tests.manual").state == RunState.PENDING
    finally:
        for event in blockers:
            event.set()
    node.executor.wait_idle(5)
    node.task_done()  # what every handler's completion does
    assert node._pending_due <= node.clock.now()


def test_a_database_error_anywhere_in_a_tick_does_not_end_the_loop(node, monkeypatch):
    def unreachable(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("django_cluster_jobs.engine.node.load_planned", unreachable)
    node.request_reload()
    node.tick()  # the reload fails: logged, not raised
    assert node._reload.is_set(), "the failed reload is retried at the next tick"
    monkeypatch.undo()
    node.tick()
    assert not node._reload.is_set() and "tests.every_second" in node.planned


def test_looking_for_pending_runs_writes_nothing_when_none_is_due(node):
    """The pending-run poll reads first: an idle node takes no write lock (SQLite's writer).

    Every node polls on SQLite; on PostgreSQL one does while its LISTEN connection is down."""
    from django.db import connection

    from django_cluster_jobs import services

    if node.listener is not None:
        node.listener.stop()  # as while its LISTEN connection is down
        assert not node.listener.healthy
    services.enqueue("tests.manual", at=node.clock.now() + timedelta(hours=1))
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql.split(None, 1)[0].upper())
        return execute(sql, params, many, context)

    node.planner.clear()
    with connection.execute_wrapper(record):
        node.wake_pending()
        node.tick()
    assert sent and set(sent) == {"SELECT"}, sent
    assert node._pending_due is not None
    assert JobRun.objects.get(job__name="tests.manual").state == RunState.PENDING


@pytest.mark.postgresql
def test_a_leader_beat_gives_up_on_a_lease_row_a_frozen_process_holds(node):
    """A row lock held by a process frozen mid-transaction must not stall the heartbeat thread,
    which has to come back to renew this node's own leases."""
    from django.db import DatabaseError, connections

    from django_cluster_jobs.models import Lease

    node.leader.beat()  # the lease row exists and this node leads
    locked, release = threading.Event(), threading.Event()

    def frozen_holder() -> None:
        try:
            with transaction.atomic():
                list(Lease.objects.select_for_update().filter(name="leader").values_list("pk"))
                locked.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=frozen_holder)
    holder.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        with pytest.raises(DatabaseError):
            node.leader.beat()
        assert time.monotonic() - started < 5, "the beat waited on the lock"
    finally:
        release.set()
        holder.join(10)
    node.leader.beat()  # the lock is gone: the next beat goes through
    assert node.leader.held is not None


@pytest.mark.parametrize("minutes", [-5, 5])
def test_a_node_whose_clock_is_off_starts_and_plans_in_cluster_time(minutes):
    """Its start is stored, and its first plan made, on the database's clock, so it fires the
    occurrences after its start: none from minutes before, none left to the leader's catch-up."""
    from datetime import UTC, datetime

    from django_cluster_jobs.engine import Clock
    from django_cluster_jobs.models import WorkerNode

    JobDefinition.objects.filter(name="tests.every_second").update(enabled=True)
    before = datetime.now(UTC)
    node = Node("skewed", clock=Clock(skew=timedelta(minutes=minutes)), threads=2)
    node.start()
    try:
        after = datetime.now(UTC)
        started = WorkerNode.objects.get(node_id="skewed").started_at
        margin = timedelta(seconds=2)  # the database's clock is this machine's
        assert before - margin <= started <= after + margin
        every_second = node.planned["tests.every_second"].schedule
        due = sorted(
            at for at, name in node.planner.pop_due(after + margin) if name == "tests.every_second"
        )
        assert due and due[0] == every_second.next_after(node._collected_until)
        assert abs(node._collected_until - started) < timedelta(milliseconds=50)
    finally:
        node.stop()

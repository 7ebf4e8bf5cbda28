"""The node loop in process: fail-closed claims, batch sizes, capacity, startup jobs."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, transaction

from django_cluster_jobs.conf import app_settings
from django_cluster_jobs.coordination import get_vendor
from django_cluster_jobs.engine import Clock, Node
from django_cluster_jobs.ledger import Ledger
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from tests import timing
from tests.conftest import wait_until
from tests.factories import RunningRunFactory
from tests.models import Effect
from tests.timing import scaled

pytestmark = pytest.mark.django_db(transaction=True)

#: A blocker holds an executor thread (or a transaction its row lock) until the test lets it go:
#: a hang guard far past anything the test waits for meanwhile (a tick, a heartbeat or two).
HELD_AT_MOST = scaled(60)
#: Released blockers give their threads back (they only return).
THREADS_FREED = scaled(10)


class FlakyVendor:
    """Delegates to the real vendor; ``claim`` raises while ``down`` is set."""

    def __init__(self) -> None:
        self.real = get_vendor()
        self.down = False

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def claim(self, *args, **kwargs):
        if self.down:
            raise OperationalError("could not connect to server: Connection refused")
        return self.real.claim(*args, **kwargs)


@pytest.fixture
def node():
    node = Node("in-process", ledger=Ledger(FlakyVendor()), threads=2)
    node.start()
    enable("tests.every_second")
    node.reload()
    yield node
    node.stop()


def enable(name: str) -> None:
    """Enable a job as the admin does (through save(), which moves the job's mark)."""
    job = JobDefinition.objects.get(name=name)
    job.enabled = True
    job.save()


def replanned(node: Node) -> None:
    """Wait until the heartbeat has seen every definition change, and re-plan for it now, so
    that the next tick does nothing but what the test asks of it."""
    current = node.ledger.definitions_version()
    wait_until(lambda: node.heartbeat._version == current, timeout=timing.REACT)
    if node._reload.is_set():
        node._reload.clear()
        node.reload()


def fire(node: Node, name: str) -> None:
    """Make the next occurrence of ``name`` due, then run one tick at it."""
    planned = node.planned[name]
    due = planned.schedule.next_after(max(node.clock.now(), planned.definition.settled_through))
    # A little past it: on PostgreSQL each heartbeat corrects the clock's offset by a few ms.
    timing.pause(max(0.0, (due - node.clock.now()).total_seconds()) + 0.05)
    replanned(node)
    node.claimer.planner.clear()
    node.claimer.planner.push(due, name)
    node.tick()


@pytest.mark.timing
def test_a_failed_claim_skips_the_occurrence_and_the_loop_survives(node, caplog):
    node.ledger.vendor.down = True
    with caplog.at_level(logging.WARNING, logger="django_cluster_jobs"):
        fire(node, "tests.every_second")
    assert not JobRun.objects.exists()
    assert node.counters.skipped["claim_failed"] == 1
    [record] = [r for r in caplog.records if "fail-closed" in r.getMessage()]
    assert "tests.every_second @ " in record.getMessage() and record.job == "tests.every_second"

    node.ledger.vendor.down = False
    fire(node, "tests.every_second")
    wait_until(lambda: JobRun.objects.filter(state=RunState.SUCCEEDED).exists(),
               timeout=timing.RUN_ENDS)  # fmt: skip
    assert Effect.objects.count() == 1


@pytest.mark.timing
def test_a_full_executor_skips_instead_of_claiming(node):
    blockers = [threading.Event() for _ in range(2)]
    for event in blockers:
        assert node.executor.submit(lambda e=event: e.wait(HELD_AT_MOST))
    try:
        fire(node, "tests.every_second")
        assert not JobRun.objects.exists()
        assert node.counters.skipped["node_busy"] == 1
    finally:
        for event in blockers:
            event.set()


@pytest.mark.timing
def test_a_disabled_job_is_skipped_with_its_reason(node):
    JobDefinition.objects.filter(name="tests.every_second").update(enabled=False)
    node.reload()
    fire(node, "tests.every_second")
    assert not JobRun.objects.exists()
    assert node.counters.skipped["disabled"] == 1


@pytest.mark.timing
def test_handler_failure_is_recorded_with_traceback(node):
    JobDefinition.objects.filter(name="tests.boom").update(
        schedule_kind="every", interval=timedelta(seconds=1)
    )
    node.reload()
    fire(node, "tests.boom")
    run = wait_until(
        lambda: JobRun.objects.filter(job__name="tests.boom", state=RunState.FAILED).first(),
        timeout=timing.RUN_ENDS,
    )
    assert run.error == "RuntimeError: boom" and "Traceback" in run.traceback


def test_an_edit_stamped_older_than_the_newest_row_is_still_noticed(node):
    """A web server whose clock is behind stamps an older updated_at: the change still counts."""
    from datetime import UTC, datetime
    from unittest import mock

    before = node.ledger.definitions_version()
    job = JobDefinition.objects.get(name="tests.manual")
    job.priority = 5
    with mock.patch("django.utils.timezone.now", return_value=datetime(2000, 1, 1, tzinfo=UTC)):
        job.save()
    assert JobDefinition.objects.get(pk=job.pk).updated_at.year == 2000
    assert node.ledger.definitions_version() != before


def test_every_kind_of_definition_change_moves_the_counter_the_heartbeat_reads(node):
    from tests.factories import JobDefinitionFactory

    seen = [node.ledger.definitions_version()]
    job = JobDefinitionFactory(name="counted")  # created
    seen.append(node.ledger.definitions_version())
    job.priority = 3
    job.save()  # edited
    seen.append(node.ledger.definitions_version())
    JobDefinition.objects.filter(pk=job.pk).delete()  # deleted through a queryset
    seen.append(node.ledger.definitions_version())
    assert len(set(seen)) == 4, seen
    beat = node.ledger.vendor.heartbeat(
        node.node_id, node.clock.now(), node.clock.now(), node.counters.snapshot(0.0)
    )
    assert beat.definitions == seen[-1]


def test_a_definition_saved_while_the_node_starts_is_picked_up():
    from django_cluster_jobs.engine.registration import sync_definitions
    from tests.factories import JobDefinitionFactory

    late = Node("late", threads=1)
    late.register()
    sync_definitions(late.registry, late.ledger.alias)
    late.heartbeat.prime()
    late.reload()
    JobDefinitionFactory(name="saved-during-start", callable_name="tests.manual")
    late.heartbeat.beat()  # the first heartbeat sees the change...
    late.tick()  # ...and the next tick re-plans with it
    try:
        assert "saved-during-start" in late.planned
    finally:
        late.stop()


def test_due_pending_work_it_cannot_take_does_not_spin_the_loop(node, monkeypatch):
    """With no free thread, the next look is a poll interval after the pass, not now."""
    from django_cluster_jobs import services

    # Only this test wakes the taker or moves the clock's offset: the run's announcement and
    # the listener's (re)connection would each ask for a look now, at any moment.
    for thread in (node.listener, node.heartbeat):
        if thread is not None:
            thread.stop()
    ticked = []
    real_tick = node.taker.tick
    monkeypatch.setattr(node.taker, "tick", lambda jobs, now: (ticked.append(now),
                                                               real_tick(jobs, now)))  # fmt: skip
    blockers = [threading.Event() for _ in range(2)]
    for event in blockers:
        assert node.executor.submit(lambda e=event: e.wait(HELD_AT_MOST))
    try:
        services.enqueue("tests.manual")
        node.taker.wake()
        node.tick()
        poll = timedelta(seconds=app_settings.POLL_INTERVAL)
        assert node.taker.due >= ticked[-1] + poll, "the loop would spin"
        assert JobRun.objects.get(job__name="tests.manual").state == RunState.PENDING
    finally:
        for event in blockers:
            event.set()
    assert node.executor.wait_idle(THREADS_FREED)
    node.taker.thread_freed()  # what every handler's completion does
    assert node.taker.due <= node.clock.now()


@pytest.mark.timing
def test_a_database_error_anywhere_in_a_tick_does_not_end_the_loop(node, monkeypatch):
    def unreachable(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    replanned(node)  # the fixture's enable() is seen: no reload but the one this test asks for
    monkeypatch.setattr(node.definitions, "changes", unreachable)
    node.request_reload()
    node.tick()  # the reload fails: logged, not raised
    assert node._reload.is_set(), "the failed reload is retried at the next tick"
    monkeypatch.undo()
    node.tick()
    assert not node._reload.is_set() and "tests.every_second" in node.planned


@pytest.mark.timing
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

    replanned(node)
    node.claimer.planner.clear()
    with connection.execute_wrapper(record):
        node.taker.wake()
        node.tick()
    assert sent and set(sent) == {"SELECT"}, sent
    assert node.taker.due is not None
    assert JobRun.objects.get(job__name="tests.manual").state == RunState.PENDING


@pytest.mark.postgresql
def test_a_leader_beat_gives_up_on_a_lease_row_a_frozen_process_holds(node):
    """A row lock held by a process frozen mid-transaction must not stall the heartbeat thread,
    which has to come back to renew this node's own leases."""
    from django.db import DatabaseError, connections

    from django_cluster_jobs.coordination import is_lock_timeout
    from django_cluster_jobs.models import Lease

    node.leader_thread.stop()  # only this test beats the leader (its own beats wait on locks)
    node.leader.beat()  # the lease row exists and this node leads
    locked, release = threading.Event(), threading.Event()

    def frozen_holder() -> None:
        try:
            with transaction.atomic():
                list(Lease.objects.select_for_update().filter(name="leader").values_list("pk"))
                locked.set()
                release.wait(HELD_AT_MOST)  # frozen until the test is done with the beat
        finally:
            connections.close_all()

    holder = threading.Thread(target=frozen_holder)
    holder.start()
    try:
        assert locked.wait(HELD_AT_MOST)
        with pytest.raises(DatabaseError) as caught:
            node.leader.beat()
        # The server gave up on the lock (lock_timeout, SQLSTATE 55P03): the beat bounded its
        # wait, it did not wait the holder out nor fail on something else.
        assert is_lock_timeout(caught.value), repr(caught.value)
    finally:
        release.set()
        holder.join(HELD_AT_MOST)
    node.leader.beat()  # the lock is gone: the next beat goes through
    assert node.leader.held is not None


@pytest.mark.parametrize("minutes", [-5, 5])
def test_a_node_whose_clock_is_off_starts_and_plans_in_cluster_time(minutes):
    """Its start is stored, and its first plan made, on the database's clock, so it fires the
    occurrences after its start: none from minutes before, none left to the leader's catch-up."""
    from datetime import UTC, datetime

    from django_cluster_jobs.engine.registration import sync_definitions
    from django_cluster_jobs.models import WorkerNode
    from django_cluster_jobs.registry import registry

    # The jobs exist before the node begins to start: a job created during the start is due
    # from its creation (its own mark), which may fall a second later than the node's start.
    sync_definitions(registry, "default")
    before = datetime.now(UTC)
    node = Node("skewed", clock=Clock(skew=timedelta(minutes=minutes)), threads=2)
    node.start()
    try:
        after = datetime.now(UTC)
        started = WorkerNode.objects.get(node_id="skewed").started_at
        margin = timedelta(seconds=2)  # the database's clock is this machine's
        assert before - margin <= started <= after + margin
        every_second = node.planned["tests.every_second"].schedule
        popped = node.claimer.planner.pop_due(after + margin)
        due = sorted(at for at, name in popped if name == "tests.every_second")
        assert due and due[0] == every_second.next_after(node.claimer.started_at)
        assert abs(node.claimer.started_at - started) < timedelta(milliseconds=50)
    finally:
        node.stop()


# -- issue: recovery that never repeats or drops an occurrence -------------------------------


@pytest.mark.timing
@pytest.mark.parametrize("change", ["disabled", "paused"])
def test_a_claim_the_gate_refuses_is_counted_by_its_reason_not_as_lost(node, change):
    """8.10: the node's copy says the job runs; the database refuses the claim."""
    far = node.clock.now() + timedelta(hours=1)
    fields = {"enabled": False} if change == "disabled" else {"paused_until": far}
    JobDefinition.objects.filter(name="tests.every_second").update(**fields)  # unseen yet
    fire(node, "tests.every_second")
    assert not JobRun.objects.exists()
    assert node.counters.skipped[change] == 1
    assert (node.counters.lost, node.counters.skipped["claimed_elsewhere"]) == (0, 0)


def test_a_run_that_starts_during_a_heartbeat_is_not_taken_for_lost(node, monkeypatch):
    """8.12: only what the database answers about the runs the heartbeat sent decides."""
    from django_cluster_jobs.coordination import Won
    from django_cluster_jobs.engine.runner import Active, Stop

    run = RunningRunFactory(node=node.node_id)
    planned = node.planned["tests.manual"]
    won = Won(run.pk, run.job_id, run.key, run.fence)
    active = Active(won, planned, node.runner.context(won, planned, run.scheduled_at, {}))
    real = node.ledger.vendor.real.heartbeat

    def registers_meanwhile(*args, **kwargs):
        with node.runner._lock:  # Runner.run registering between the snapshot and the answer
            node.runner.running[run.pk] = active
        return real(*args, **kwargs)

    monkeypatch.setattr(node.ledger.vendor, "heartbeat", registers_meanwhile, raising=False)
    node.heartbeat._renew()
    assert not active.context.cancelled and active.why == Stop.NONE
    node.heartbeat._renew()  # now sent, and the database confirms it under its fence
    assert not active.context.cancelled
    JobRun.objects.filter(pk=run.pk).update(fence=run.fence + 1)  # taken over meanwhile
    node.heartbeat._renew()
    assert active.context.cancelled and active.why == Stop.LOST


def test_a_run_that_ends_during_a_heartbeat_is_not_taken_for_lost(node, monkeypatch, caplog):
    """A handler that finishes between the heartbeat's snapshot and the database's answer is
    no longer running there: that is not a takeover, and nothing is logged as one."""
    from django_cluster_jobs.coordination import Won
    from django_cluster_jobs.engine.runner import Active

    run = RunningRunFactory(node=node.node_id)
    planned = node.planned["tests.manual"]
    won = Won(run.pk, run.job_id, run.key, run.fence)
    active = Active(won, planned, node.runner.context(won, planned, run.scheduled_at, {}))
    with node.runner._lock:
        node.runner.running[run.pk] = active
    real = node.ledger.vendor.real.heartbeat

    def ends_meanwhile(*args, **kwargs):
        JobRun.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED)  # the run concludes
        with node.runner._lock:
            node.runner.running.pop(run.pk)
        return real(*args, **kwargs)

    monkeypatch.setattr(node.ledger.vendor, "heartbeat", ends_meanwhile, raising=False)
    with caplog.at_level(logging.WARNING, logger="django_cluster_jobs"):
        node.heartbeat._renew()
    assert not [r for r in caplog.records if "no longer owned" in r.getMessage()]
    assert node.heartbeat._lost == set()


class RoundTripClock(Clock):
    """A clock that keeps the round trip of every offset it measured."""

    def __init__(self, skew: timedelta) -> None:
        super().__init__(skew)
        self.round_trips: list[timedelta] = []

    def observe(self, sent, db_time, received) -> None:
        self.round_trips.append(received - sent)
        super().observe(sent, db_time, received)


def test_the_clock_offset_is_exact_where_the_database_is_on_this_host():
    """8.8: on SQLite the offset is known, not estimated; elsewhere it is measured, and off by
    no more than half the round trip it was measured from (the database runs on this host)."""
    from django_cluster_jobs.models import WorkerNode

    for skew, name in ((timedelta(0), "true"), (timedelta(seconds=2.5), "ahead")):
        node = Node(name, clock=RoundTripClock(skew=skew), threads=1)
        node.start()
        try:
            offset = WorkerNode.objects.get(node_id=name).clock_offset_ms
            if node.ledger.vendor.features.clock_is_local:
                assert node.clock.offset == -skew and offset == -skew.total_seconds() * 1000
            else:  # off by at most half the round trip it was measured from (the stored value
                # is one of the measured ones), plus a millisecond for the stored float
                half = max(node.clock.round_trips) / 2
                error = abs(offset + skew.total_seconds() * 1000)
                assert error <= half.total_seconds() * 1000 + 1, (error, half)
        finally:
            node.stop()


def test_a_handler_never_starts_before_its_occurrence_by_cluster_time(node):
    """8.8: a claim a few milliseconds early (an offset corrected meanwhile) waits for its time."""
    from django_cluster_jobs import signals
    from django_cluster_jobs.coordination import Claim

    planned = node.planned["tests.manual"]
    due = node.clock.now() + timedelta(milliseconds=300)
    claim = Claim(planned.definition.pk, "early", due)
    [won] = node.ledger.vendor.claim([claim], node.node_id, node.clock.now(),
                                   node.clock.now() + timedelta(seconds=30))  # fmt: skip
    started = []

    def at_start(sender, **kwargs):
        started.append(node.clock.now())

    signals.run_started.connect(at_start)
    try:
        node.runner.run(won, planned, due, {})
    finally:
        signals.run_started.disconnect(at_start)
    assert started and started[0] >= due


@pytest.mark.timing
def test_a_deposed_leaders_chores_write_nothing(node):
    """A leader whose lease was taken over reaps, buries, purges and settles nothing."""
    from datetime import UTC, datetime

    from django.db.models import F

    from django_cluster_jobs.models import Lease, NodeStatus, WorkerNode
    from tests.factories import JobDefinitionFactory, JobRunFactory, WorkerNodeFactory

    leader = node.leader
    wait_until(lambda: leader.held is not None, timeout=timing.REACT)
    # Nothing else beats or does chores meanwhile: only this test's call may act on the rows.
    for thread in (node.heartbeat, node.leader_thread, node.presence):
        if thread is not None:
            thread.stop()
    now = node.clock.now()
    expired = RunningRunFactory(node="gone", lease_expires_at=now - timedelta(minutes=1))
    WorkerNodeFactory(node_id="silent", last_heartbeat=now - timedelta(hours=1))
    old = JobRunFactory(finished_at=now - timedelta(days=60), scheduled_at=now - timedelta(days=60))
    missed = JobDefinitionFactory(cron="* * * * * *", overlap="allow",
                                  settled_through=now - timedelta(minutes=1))  # fmt: skip
    Lease.objects.filter(name="leader").update(
        holder="usurper", token="other", fence=F("fence") + 1,
        expires_at=datetime(2099, 1, 1, tzinfo=UTC),
    )  # fmt: skip
    leader._last_purge = None
    assert leader.chores(now) is False and leader.held is None
    expired.refresh_from_db()
    assert (expired.state, expired.fence) == (RunState.RUNNING, 1)
    assert WorkerNode.objects.get(node_id="silent").status == NodeStatus.ACTIVE
    assert JobRun.objects.filter(pk=old.pk).exists()
    assert not JobRun.objects.filter(job=missed).exists()
    assert JobDefinition.objects.get(pk=missed.pk).settled_through == now - timedelta(minutes=1)


@pytest.mark.timing
def test_an_occurrence_falling_while_the_node_copies_its_definitions_is_its_own(monkeypatch):
    """A node exists from the moment it begins to start: an occurrence due while it copies its
    definitions (slow on a loaded host) is fired by it, not settled by the leader as missed."""
    import math

    from django_cluster_jobs.engine import node as node_module
    from django_cluster_jobs.engine.registration import sync_definitions
    from django_cluster_jobs.models import Outcome

    slow = Node("slow-start", threads=2)
    sync_definitions(slow.registry, slow.ledger.alias)
    enable("tests.every_second")  # its mark: now
    due = math.floor(slow.clock.now().timestamp()) + 1  # the next whole second

    def slow_sync(jobs, alias):
        sync_definitions(jobs, alias)
        time.sleep(max(0.0, due + 0.2 - slow.clock.now().timestamp()))

    monkeypatch.setattr(node_module, "sync_definitions", slow_sync)
    slow.start()
    try:
        slow.tick()
        run = wait_until(
            lambda: JobRun.objects.filter(
                job__name="tests.every_second", scheduled_at__second=due % 60
            ).first(),
            timing.RUN_ENDS,
        )
        assert (run.outcome, run.node) == (Outcome.WON, "slow-start"), run.reason
    finally:
        slow.stop()

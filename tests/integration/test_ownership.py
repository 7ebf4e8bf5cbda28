"""Leases, the leader's fenced chores, reaping, hand-back and purge, on every coordination path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_cluster_jobs import LockLost, LockNotAcquired, cluster_lock
from django_cluster_jobs.coordination import Won
from django_cluster_jobs.ledger import leases
from django_cluster_jobs.ledger.leases import Held
from django_cluster_jobs.models import (
    ClusterEvent,
    EventKind,
    JobRun,
    Lease,
    NodeStatus,
    RunState,
    WorkerNode,
)
from tests import timing
from tests.factories import (
    JobDefinitionFactory,
    JobRunFactory,
    RunningRunFactory,
    WorkerNodeFactory,
)
from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
TTL = timedelta(seconds=10)
SECOND = timedelta(seconds=1)
#: The ttl of the cluster locks that renew themselves: a lock renews every third of it, so a
#: healthy node renews it well before it expires.
LOCK_TTL = timing.scaled(1.5)


def test_lease_acquire_renew_and_take_over_bump_the_fence_only_on_a_new_holder():
    a = leases.acquire("default", "leader", "a", "ta", T0, TTL)
    assert a is not None and a.acquired and a.fence == 1
    renewed = leases.acquire("default", "leader", "a", "ta", T0 + timedelta(seconds=5), TTL)
    assert renewed.fence == 1 and not renewed.acquired
    assert leases.acquire("default", "leader", "b", "tb", T0 + timedelta(seconds=9), TTL) is None
    b = leases.acquire("default", "leader", "b", "tb", T0 + timedelta(seconds=16), TTL)
    assert b.acquired and b.fence == 2 and b.holder == "b"
    assert leases.acquire("default", "leader", "a", "ta", T0 + timedelta(seconds=17), TTL) is None


def test_a_renewal_from_the_previous_hold_is_one_update_and_keeps_the_fence():
    from django.db import connection

    a = leases.acquire("default", "leader", "a", "ta", T0, TTL)
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql.split(None, 1)[0].upper())
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        renewed = leases.acquire("default", "leader", "a", "ta", T0 + 5 * SECOND, TTL, previous=a)
    assert sent == ["UPDATE"]
    assert (renewed.fence, renewed.holder, renewed.acquired) == (1, "a", False)
    assert renewed.expires_at == T0 + 5 * SECOND + TTL == Lease.objects.get().expires_at
    # Lost and taken back: the other branch, a new fence, whatever ``previous`` says.
    leases.acquire("default", "leader", "b", "tb", T0 + 16 * SECOND, TTL)
    back = leases.acquire("default", "leader", "a", "ta", T0 + 27 * SECOND, TTL, previous=renewed)
    assert back.acquired and back.fence == 3


def test_a_deposed_holder_is_fenced_out_of_its_writes():
    a = leases.acquire("default", "leader", "a", "ta", T0, TTL)
    later = T0 + timedelta(seconds=11)
    leases.acquire("default", "leader", "b", "tb", later, TTL)
    assert not leases.still_held("default", a, later)
    stale = Held("leader", "a", "ta", a.fence, a.expires_at, True)
    assert not leases.still_held("default", stale, T0 + timedelta(seconds=1))


def test_concurrent_acquirers_get_one_holder():
    results = race(4, lambda i: leases.acquire("default", "race", f"n{i}", f"t{i}", T0, TTL))
    assert sum(r is not None for r in results) == 1
    assert Lease.objects.get(name="race").fence == 1


def test_reap_retakes_at_least_once_and_loses_at_most_once(ledger):
    alo = JobDefinitionFactory(delivery="at_least_once")
    amo = JobDefinitionFactory(delivery="at_most_once")
    expired = T0 - timedelta(seconds=1)
    r1 = RunningRunFactory(job=alo, node="dead", lease_expires_at=expired)
    r2 = RunningRunFactory(job=amo, node="dead", lease_expires_at=expired)
    live = RunningRunFactory(job=alo, node="alive", lease_expires_at=T0 + TTL)
    assert ledger.chores.reap_expired(T0, "leader") == 2
    r1.refresh_from_db(), r2.refresh_from_db(), live.refresh_from_db()
    assert (r1.state, r1.attempt, r1.fence, r1.node) == (RunState.PENDING, 2, 2, "")
    assert (r2.state, r2.attempt, r2.fence) == (RunState.LOST, 1, 2)
    assert live.state == RunState.RUNNING and live.fence == 1
    assert r1.events.get().kind == EventKind.LEASE_EXPIRED
    assert r2.events.get().kind == EventKind.LOST

    [taken] = ledger.vendor.take_pending("b", [alo.pk], 5, T0, T0 + TTL)
    assert (taken.run_id, taken.fence, taken.attempt) == (r1.pk, 3, 2)
    assert r1.events.last().kind == EventKind.TAKEN_OVER
    old = Won(r1.pk, alo.pk, r1.key, fence=1)
    assert not ledger.runs.finish(old, "dead", RunState.SUCCEEDED, T0)
    assert ledger.runs.finish(taken, "b", RunState.SUCCEEDED, T0)


def test_a_poison_run_is_dead_lettered_after_repeated_takeovers(ledger):
    job = JobDefinitionFactory(max_attempts=1)
    run = RunningRunFactory(job=job, attempt=3, lease_expires_at=T0 - timedelta(seconds=1))
    ledger.chores.reap_expired(T0, "leader")
    run.refresh_from_db()
    assert run.state == RunState.DEAD and run.events.get().kind == EventKind.DEAD_LETTERED


def test_pending_runs_are_taken_by_priority_then_due_time_without_double_taking(ledger):
    job = JobDefinitionFactory()
    low = JobRunFactory(job=job, state=RunState.PENDING, priority=0, due_at=T0 - TTL)
    high = JobRunFactory(job=job, state=RunState.PENDING, priority=5, due_at=T0)
    JobRunFactory(job=job, state=RunState.PENDING, due_at=T0 + TTL)  # not due yet
    first = ledger.vendor.take_pending("a", [job.pk], 1, T0, T0 + TTL)
    second = ledger.vendor.take_pending("b", [job.pk], 5, T0, T0 + TTL)
    assert [w.run_id for w in first] == [high.pk] and [w.run_id for w in second] == [low.pk]
    assert ledger.next_pending_due([job.pk]) == T0 + TTL
    assert ledger.vendor.take_pending("c", [job.pk + 999], 5, T0, T0 + TTL) == []


def test_hand_back_makes_the_run_pending_at_once(ledger):
    job = JobDefinitionFactory()
    run = RunningRunFactory(job=job, node="a")
    assert ledger.runs.hand_back(Won(run.pk, job.pk, run.key), "a", T0) == RunState.PENDING
    run.refresh_from_db()
    assert (run.state, run.due_at, run.fence, run.attempt) == (RunState.PENDING, T0, 2, 2)
    assert ledger.runs.hand_back(Won(run.pk, job.pk, run.key), "a", T0) is None


def test_mark_dead_nodes(ledger):
    WorkerNodeFactory(node_id="old", last_heartbeat=T0 - timedelta(minutes=2))
    WorkerNodeFactory(node_id="fresh", last_heartbeat=T0)
    WorkerNodeFactory(
        node_id="gone", status=NodeStatus.STOPPED, last_heartbeat=T0 - timedelta(hours=1)
    )
    assert ledger.chores.mark_dead_nodes(T0, timedelta(minutes=1), "leader") == ["old"]
    statuses = dict(WorkerNode.objects.values_list("node_id", "status"))
    assert statuses == {"old": "dead", "fresh": "active", "gone": "stopped"}
    assert ClusterEvent.objects.get().node == "old"


def test_purge_keeps_live_runs_recent_runs_and_the_latest_run_of_each_fixed_delay_job(
    ledger,
):
    """No recovery decision reads finished rows (the marks stand for them), so the latest run of
    a job goes like any other; a fixed-delay job's latest run times its next one, and stays."""
    job, other = JobDefinitionFactory(), JobDefinitionFactory()
    delay = JobDefinitionFactory(schedule_kind="delay", cron="", interval=timedelta(days=40))
    old = T0 - timedelta(days=30)
    doomed = JobRunFactory(job=job, scheduled_at=old, finished_at=old)
    latest_of_other = JobRunFactory(job=other, scheduled_at=old, finished_at=old)
    live = RunningRunFactory(job=job, scheduled_at=old)
    recent = JobRunFactory(job=job, scheduled_at=T0 - timedelta(days=1), finished_at=T0)
    before_delay = JobRunFactory(job=delay, scheduled_at=old - timedelta(days=40), finished_at=old)
    latest_delay = JobRunFactory(job=delay, scheduled_at=old, finished_at=old)
    assert ledger.chores.purge(T0, timedelta(days=14)) == 3
    remaining = set(JobRun.objects.values_list("pk", flat=True))
    assert remaining == {live.pk, recent.pk, latest_delay.pk}
    assert {doomed.pk, latest_of_other.pk, before_delay.pk}.isdisjoint(remaining)


def test_a_fixed_delay_job_that_never_ran_does_not_stop_the_purge(ledger):
    """Its latest run is NULL; NOT IN with a NULL in it used to match no row, purging nothing."""
    JobDefinitionFactory(schedule_kind="delay", cron="", interval=timedelta(minutes=5))
    old = T0 - timedelta(days=30)
    doomed = JobRunFactory(job=JobDefinitionFactory(), scheduled_at=old, finished_at=old)
    assert ledger.chores.purge(T0, timedelta(days=14)) == 1
    assert not JobRun.objects.filter(pk=doomed.pk).exists()


def test_retention_is_the_setting_whatever_the_schedules():
    from django_cluster_jobs.engine.leader import retention

    assert retention() == timedelta(days=14)


def test_cluster_lock_is_exclusive_fenced_and_released():
    with cluster_lock("reports", ttl=5) as first:
        assert first.fence == 1
        with pytest.raises(LockNotAcquired), cluster_lock("reports", ttl=5):
            pass
    with cluster_lock("reports", ttl=5) as second:
        assert second.fence == 2 and not second.is_lost


@pytest.mark.timing
def test_cluster_lock_renews_itself_while_held():
    with cluster_lock("long", ttl=LOCK_TTL) as handle:
        timing.pause(2 * LOCK_TTL)  # longer than the ttl: renewal must keep it
        assert not handle.is_lost
        assert Lease.objects.get(name="lock:long").fence == handle.fence


@pytest.mark.timing
def test_cluster_lock_notices_when_it_is_lost():
    with pytest.raises(LockLost), cluster_lock("stolen", ttl=LOCK_TTL) as handle:
        Lease.objects.filter(name="lock:stolen").update(
            token="other", holder="other", fence=handle.fence + 1
        )
        assert handle.lost.wait(LOCK_TTL + timing.REACT)  # its next renewal finds it taken


@pytest.mark.timing
def test_cluster_lock_is_lost_when_it_cannot_be_renewed_before_it_expires(monkeypatch):
    from django.db import OperationalError

    with pytest.raises(LockLost), cluster_lock("cut-off", ttl=LOCK_TTL) as handle:

        def unreachable(*args, **kwargs):
            raise OperationalError("could not connect to server")

        monkeypatch.setattr(leases, "acquire", unreachable)
        assert handle.lost.wait(LOCK_TTL + timing.REACT)  # given up once its lease expired


@pytest.mark.parametrize("attempt", [1, 3], ids=["released", "buried"])
def test_a_lease_renewed_between_the_reapers_read_and_its_write_is_kept(
    ledger, monkeypatch, attempt
):
    """8.7: the reaper's write re-checks the expiry, so a renewal that lands in between wins."""
    job = JobDefinitionFactory(max_attempts=1)
    run = RunningRunFactory(
        job=job, node="slow", attempt=attempt, lease_expires_at=T0 - timedelta(seconds=1)
    )
    part, name = (ledger.runs, "release") if attempt == 1 else (ledger.chores, "_bury")
    write = getattr(type(part), name)

    def renewed_first(self, pk, *args, **kwargs):
        JobRun.objects.filter(pk=pk).update(lease_expires_at=T0 + TTL)  # its owner's heartbeat
        return write(self, pk, *args, **kwargs)

    monkeypatch.setattr(type(part), name, renewed_first)
    assert ledger.chores.reap_expired(T0, "leader") == 0
    run.refresh_from_db()
    assert (run.state, run.fence, run.node, run.attempt) == (RunState.RUNNING, 1, "slow", attempt)
    assert not run.events.exists()


def test_a_purge_keeps_rows_after_their_jobs_mark_however_short_the_retention(ledger):
    """The next settling pass reads the rows after the mark: purging one would let its
    occurrence be decided again (found by the protocol model)."""
    job = JobDefinitionFactory(settled_through=T0 - timedelta(seconds=10))
    before = JobRunFactory(job=job, scheduled_at=T0 - timedelta(seconds=20), finished_at=T0)
    after = JobRunFactory(job=job, scheduled_at=T0 - timedelta(seconds=5), finished_at=T0)
    assert ledger.chores.purge(T0 + timedelta(seconds=1), timedelta(0)) == 1
    assert list(JobRun.objects.values_list("pk", flat=True)) == [after.pk]
    assert not JobRun.objects.filter(pk=before.pk).exists()


def test_a_queue_lock_row_an_operator_deleted_is_created_again_and_locked():
    """The portable path serialises a queue's gated claims on a lease row: one deleted in the
    admin must not leave the next claims unserialised."""
    from django.db import transaction

    from django_cluster_jobs.coordination import get_vendor
    from django_cluster_jobs.models import Lease

    vendor = get_vendor(kind="orm")
    with transaction.atomic():
        vendor.lock_queue("reports")
    Lease.objects.filter(name="queue:reports").delete()
    locked = []
    with transaction.atomic():
        vendor.lock_queue("reports")
        locked = list(Lease.objects.filter(name="queue:reports").values_list("name", flat=True))
    assert locked == ["queue:reports"]

"""The stored rank of pending runs: the take's order, kept at every write that makes a run
pending, exact at the microsecond, and served by an index."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from django_cluster_jobs import RunRequest, services
from django_cluster_jobs.coordination import Won, get_vendor
from django_cluster_jobs.coordination.pending import aging_step, rank_key
from django_cluster_jobs.ledger import Ledger
from django_cluster_jobs.models import PARKED, Cause, JobRun, RunState
from django_cluster_jobs.ranks import rank_of
from tests.factories import JobDefinitionFactory, JobRunFactory, RunningRunFactory

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
LEASE = NOW + timedelta(seconds=30)


def stored_rank(run: JobRun) -> int | None:
    return JobRun.objects.values_list("pending_rank", flat=True).get(pk=run.pk)


def expected(run: JobRun) -> int:
    run.refresh_from_db()
    return rank_of(run.due_at, run.priority)


def test_the_native_take_follows_the_aging_rank_over_many_random_runs():
    job = JobDefinitionFactory()
    rng = random.Random(7)
    for _ in range(300):
        due = NOW - timedelta(microseconds=rng.randrange(0, 3_600_000_000))
        JobRunFactory(job=job, state=RunState.PENDING, priority=rng.randrange(-5, 6),
                      due_at=due, scheduled_at=due)  # fmt: skip
    rows = JobRun.objects.values_list("pk", "due_at", "priority")
    order = [pk for pk, _, _ in sorted(rows, key=rank_key(aging_step(), NOW))]
    taken = get_vendor("default").take_pending("n", [job.pk], 300, NOW, LEASE)
    assert [w.run_id for w in taken] == order
    one_by_one = []
    JobRun.objects.update(state=RunState.PENDING)
    while batch := get_vendor("default").take_pending("n", [job.pk], 7, NOW, LEASE):
        one_by_one += [w.run_id for w in batch]
    assert one_by_one == order


@pytest.mark.parametrize(
    ("due", "priority"),
    [
        (datetime(1, 1, 1, tzinfo=UTC), 10**9),
        (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), -(10**9)),
        (PARKED, 100),
    ],
)
def test_no_stored_due_time_or_priority_overflows_the_rank(due, priority):
    job = JobDefinitionFactory()
    run = JobRunFactory(job=job, state=RunState.PENDING, priority=priority, due_at=due,
                        scheduled_at=due)  # fmt: skip
    assert stored_rank(run) == expected(run)
    assert abs(stored_rank(run)) < 2**63
    due_now = JobRunFactory(job=job, state=RunState.PENDING, due_at=NOW, scheduled_at=NOW)
    taken = get_vendor("default").take_pending("n", [job.pk], 5, NOW, LEASE)
    assert due_now.pk in [w.run_id for w in taken]


def test_enqueue_replay_and_bulk_store_the_rank():
    single = services.enqueue("tests.manual", {"value": 1}, priority=3)
    [bulk] = services.enqueue_many("tests.manual", [{"value": 2}], priority=-4)
    done = JobRunFactory(job=single.job, state=RunState.DEAD, priority=7)
    replayed = services.replay(done)
    for run in (single, bulk, replayed):
        assert stored_rank(run) == expected(run)


def test_retry_release_and_hand_back_store_the_rank_of_the_new_due_time():
    ledger = Ledger(get_vendor("default"))
    job = JobDefinitionFactory()
    runs = [RunningRunFactory(job=job, priority=p, fence=1) for p in (2, -3, 500)]
    won = [Won(r.pk, job.pk, r.key, 1, 1) for r in runs]
    later = NOW + timedelta(minutes=5, microseconds=17)
    assert ledger.runs.retry(won[0], "node-a", NOW, later, RunState.FAILED, "e", "")
    assert ledger.runs.hand_back(won[1], "node-a", NOW) == RunState.PENDING
    assert ledger.runs.release(runs[2].pk, 1, "leader", NOW, Cause.LEASE_EXPIRED, "gone", None)
    for run in runs:
        assert stored_rank(run) == expected(run)
    assert stored_rank(runs[0]) == rank_of(later, 2)


def test_a_released_buffered_run_is_ranked_at_its_new_due_time():
    ledger = Ledger(get_vendor("default"))
    job = JobDefinitionFactory()
    run = JobRunFactory(job=job, state=RunState.PENDING, due_at=PARKED, priority=4)
    assert ledger.runs.release_buffered(job.pk, NOW) == 1
    assert stored_rank(run) == rank_of(NOW, 4)


@pytest.mark.postgresql
def test_the_take_is_served_by_the_rank_index_on_postgresql():
    from django_cluster_jobs.coordination import sql

    rng = random.Random(3)
    items = [RunRequest({"value": i}, priority=rng.randrange(-3, 4)) for i in range(5000)]
    runs = services.enqueue_many("tests.manual", items, at=NOW - timedelta(minutes=1))
    job_id = runs[0].job_id
    query = sql.PG_TAKE_PENDING.format(
        job_ids="%s", order=sql.RANK_ORDER, lock="FOR UPDATE SKIP LOCKED"
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE cluster_jobs_jobrun")
        cursor.execute("EXPLAIN " + query, ["n", LEASE, NOW, NOW, job_id, 4, NOW])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "cluster_jobs_run_rank" in plan and "Sort" not in plan, plan


@pytest.mark.postgresql
def test_a_take_on_postgresql_is_one_statement_with_its_events():
    from django_cluster_jobs.models import RunEvent

    runs = services.enqueue_many("tests.manual", [{"value": i} for i in range(3)], at=NOW)
    vendor = get_vendor("default")
    vendor.take_pending("n", [runs[0].job_id], 1, NOW, LEASE)  # the aging check, once
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        taken = vendor.take_pending("n", [runs[0].job_id], 5, NOW, LEASE)
    assert [w.run_id for w in taken] == [runs[1].pk, runs[2].pk]
    assert [w.payload for w in taken] == [{"value": 1}, {"value": 2}]
    assert len(sent) == 1, sent
    started = RunEvent.objects.filter(run_id__in=[r.pk for r in runs], kind="started")
    assert started.count() == 3

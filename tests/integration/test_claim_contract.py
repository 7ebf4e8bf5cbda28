"""The claim contract, run identically against the vendor fast path and the portable ORM path."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from django_cluster_jobs.bounds import EARLIEST_RUN_AT
from django_cluster_jobs.coordination import Claim, Won
from django_cluster_jobs.models import LIVE_STATES, EventKind, JobRun, RunEvent, RunState
from tests import timing
from tests.conftest import database_url
from tests.factories import JobDefinitionFactory, RunningRunFactory
from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
LEASE = NOW + timedelta(seconds=30)


def claims_for(job_id: int, count: int, start: int = 0) -> list[Claim]:
    return [
        Claim(job_id, f"2026-05-28T09:00:{i:02d}Z", NOW + timedelta(seconds=i))
        for i in range(start, start + count)
    ]


def test_batch_claim_returns_exactly_what_this_node_won(ledger):
    job = JobDefinitionFactory()
    first = ledger.vendor.claim(claims_for(job.pk, 3), "a", NOW, LEASE)
    second = ledger.vendor.claim(claims_for(job.pk, 3, start=1), "b", NOW, LEASE)
    assert sorted(w.key for w in first) == [f"2026-05-28T09:00:0{i}Z" for i in range(3)]
    assert [w.key for w in second] == ["2026-05-28T09:00:03Z"]
    rows = JobRun.objects.order_by("key").values_list("key", "node", "state", "fence")
    assert [r[1] for r in rows] == ["a", "a", "a", "b"]
    assert {r[2] for r in rows} == {RunState.RUNNING} and {r[3] for r in rows} == {1}


def test_winner_holds_a_lease_and_a_claimed_event(ledger):
    job = JobDefinitionFactory()
    [won] = ledger.vendor.claim(claims_for(job.pk, 1), "a", NOW, LEASE)
    run = JobRun.objects.get(pk=won.run_id)
    assert (run.node, run.lease_expires_at, run.started_at) == ("a", LEASE, NOW)
    assert list(run.events.values_list("kind", "node", "fence")) == [(EventKind.CLAIMED, "a", 1)]


def test_disabled_and_paused_jobs_are_never_claimed(ledger):
    disabled = JobDefinitionFactory(enabled=False)
    paused = JobDefinitionFactory(paused_until=NOW + timedelta(minutes=5))
    resumed = JobDefinitionFactory(paused_until=NOW - timedelta(minutes=5))
    claims = [*claims_for(disabled.pk, 1), *claims_for(paused.pk, 1), *claims_for(resumed.pk, 1)]
    won = ledger.vendor.claim(claims, "a", NOW, LEASE)
    assert [w.job_id for w in won] == [resumed.pk]


def test_empty_batch_is_a_no_op(ledger):
    assert ledger.vendor.claim([], "a", NOW, LEASE) == []


def test_payload_and_outcome_are_stored(ledger):
    job = JobDefinitionFactory()
    claim = Claim(job.pk, "k", NOW, outcome="every_node", priority=7, payload={"x": [1, "y"]})
    [won] = ledger.vendor.claim([claim], "a", NOW, LEASE)
    run = JobRun.objects.get(pk=won.run_id)
    assert (run.outcome, run.priority, run.payload) == ("every_node", 7, {"x": [1, "y"]})


@pytest.mark.parametrize("size", [1, 20], ids=["small batch", "large batch"])
def test_every_column_is_stored_whatever_the_batch_size(ledger, size):
    """PostgreSQL sends small batches as VALUES rows and large ones as arrays: same result."""
    job, other, disabled = JobDefinitionFactory(), JobDefinitionFactory(), JobDefinitionFactory()
    disabled.enabled = False
    disabled.save()
    claims = [
        Claim(
            (job, other)[i % 2].pk,
            f"k{i}",
            NOW + timedelta(seconds=i),
            outcome="external" if i else "won",
            priority=i,
            payload={"i": i, "s": "é'\"", "n": None, "l": [1.5, True]},
        )
        for i in range(size)
    ]
    claims.append(Claim(disabled.pk, "k0", NOW))
    won = ledger.vendor.claim(claims, "a", NOW, LEASE)
    assert sorted((w.job_id, w.key) for w in won) == sorted((c.job_id, c.key) for c in claims[:-1])
    for c in claims[:-1]:
        run = JobRun.objects.get(job_id=c.job_id, key=c.key)
        assert (run.scheduled_at, run.due_at, run.outcome, run.priority, run.payload) == (
            c.scheduled_at,
            c.scheduled_at,
            c.outcome,
            c.priority,
            c.payload,
        )
        assert (run.state, run.node, run.fence, run.lease_expires_at) == ("running", "a", 1, LEASE)
        assert list(run.events.values_list("kind", flat=True)) == [EventKind.CLAIMED]


def race_threads(ledger, claims: list[Claim], racers: int) -> list[list[Won]]:
    """Let ``racers`` threads, each on its own connection, claim the same batch at once."""
    return race(racers, lambda i: ledger.vendor.claim(claims, f"node-{i}", NOW, LEASE))


def test_concurrent_threads_get_exactly_one_winner_per_occurrence(ledger):
    job = JobDefinitionFactory()
    claims = claims_for(job.pk, 40)
    results = race_threads(ledger, claims, racers=4)
    wins = Counter(w.key for won in results for w in won)
    assert sorted(wins) == sorted(c.key for c in claims)
    assert set(wins.values()) == {1}
    assert JobRun.objects.count() == 40
    for i, won in enumerate(results):
        assert JobRun.objects.filter(node=f"node-{i}").count() == len(won)


def test_concurrent_processes_get_exactly_one_winner_per_occurrence(ledger, monkeypatch):
    job = JobDefinitionFactory()
    keys = [c.key for c in claims_for(job.pk, 40)]
    monkeypatch.setenv("DATABASE_URL", database_url())
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    kind = "orm" if ledger.vendor.name == "orm" else "auto"
    from tests.claimers import claim_in_process

    procs = [
        ctx.Process(target=claim_in_process, args=(kind, job.pk, keys, f"p{i}", start, out))
        for i in range(3)
    ]
    for p in procs:
        p.start()
    start.set()
    # Hang guards: each claimer starts Django (as a starting node does) and races one batch.
    results = dict(out.get(timeout=timing.NODE_START + timing.RACE) for _ in procs)
    for p in procs:
        p.join(timeout=timing.NODE_EXIT)
        assert p.exitcode == 0
    wins = Counter(key for won in results.values() for key in won)
    assert sorted(wins) == sorted(keys) and set(wins.values()) == {1}
    for node, won in results.items():
        assert sorted(JobRun.objects.filter(node=node).values_list("key", flat=True)) == won


def test_racers_claiming_different_occurrences_of_a_skip_job_start_one_run(ledger):
    """overlap="skip": the job's lane admits one live run, whichever occurrence each racer
    claims and on every database (no partial index needed)."""
    job = JobDefinitionFactory(overlap="skip")
    results = race(
        6, lambda i: ledger.vendor.claim(claims_for(job.pk, 1, start=i), f"node-{i}", NOW, LEASE)
    )
    assert sum(len(won) for won in results) == 1
    assert JobRun.objects.filter(job=job, state__in=LIVE_STATES).count() == 1


@pytest.mark.parametrize("end", [RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED])
def test_a_skip_jobs_lane_is_free_again_once_its_run_ended(ledger, end):
    job = JobDefinitionFactory(overlap="skip")
    [first] = ledger.vendor.claim(claims_for(job.pk, 1), "a", NOW, LEASE)
    assert ledger.vendor.claim(claims_for(job.pk, 1, start=1), "b", NOW, LEASE) == []
    assert ledger.runs.finish(first, "a", end, NOW)
    [second] = ledger.vendor.claim(claims_for(job.pk, 1, start=2), "b", NOW, LEASE)
    assert JobRun.objects.get(pk=second.run_id).lane == job.pk


def test_window_claim_serialises_racers(ledger):
    job = JobDefinitionFactory(schedule_kind="delay", interval=timedelta(minutes=1))
    minute, recheck = timedelta(minutes=1), timedelta(seconds=5)
    results = race(
        4,
        lambda i: ledger.gates.claim_window(
            job.pk, minute, f"k{i}", f"node-{i}", NOW, LEASE, recheck
        ),
    )
    assert sum(r.won is not None for r in results) == 1
    assert JobRun.objects.filter(job=job).count() == 1


def test_window_claim_is_due_one_interval_after_the_last_finish(ledger):
    job = JobDefinitionFactory(schedule_kind="delay", interval=timedelta(minutes=1))
    RunningRunFactory(
        job=job,
        key="old",
        state=RunState.SUCCEEDED,
        scheduled_at=NOW - timedelta(minutes=3),
        finished_at=NOW - timedelta(seconds=30),
    )
    early = ledger.gates.claim_window(
        job.pk, timedelta(minutes=1), "k1", "a", NOW, LEASE, timedelta(seconds=5)
    )
    assert early.won is None and early.next_check == NOW + timedelta(seconds=30)
    later = NOW + timedelta(seconds=31)
    on_time = ledger.gates.claim_window(
        job.pk,
        timedelta(minutes=1),
        "k2",
        "a",
        later,
        later + timedelta(seconds=30),
        timedelta(seconds=5),
    )
    assert on_time.won is not None and on_time.won.key == "k2"


def test_window_claim_waits_while_a_run_is_live(ledger):
    job = JobDefinitionFactory(schedule_kind="delay", interval=timedelta(minutes=1))
    RunningRunFactory(job=job, key="live", scheduled_at=NOW - timedelta(hours=1))
    result = ledger.gates.claim_window(
        job.pk, timedelta(minutes=1), "k", "a", NOW, LEASE, timedelta(seconds=5)
    )
    assert result.won is None and result.next_check == NOW + timedelta(seconds=5)


def test_finish_with_the_current_fence_records_the_outcome(ledger):
    job = JobDefinitionFactory()
    [won] = ledger.vendor.claim(claims_for(job.pk, 1), "a", NOW, LEASE)
    assert ledger.runs.finish(won, "a", RunState.SUCCEEDED, NOW, result={"ok": 1})
    run = JobRun.objects.get(pk=won.run_id)
    assert (run.state, run.result, run.finished_at, run.lease_expires_at) == (
        RunState.SUCCEEDED,
        {"ok": 1},
        NOW,
        None,
    )
    assert run.events.last().kind == EventKind.SUCCEEDED


def test_finish_with_a_stale_fence_is_fenced_out(ledger):
    job = JobDefinitionFactory()
    [won] = ledger.vendor.claim(claims_for(job.pk, 1), "a", NOW, LEASE)
    JobRun.objects.filter(pk=won.run_id).update(fence=2, node="b")
    assert not ledger.runs.finish(won, "a", RunState.FAILED, NOW, error="late")
    run = JobRun.objects.get(pk=won.run_id)
    assert (run.state, run.error) == (RunState.RUNNING, "")
    event = RunEvent.objects.filter(run_id=won.run_id).last()
    assert (event.kind, event.node, event.fence) == (EventKind.FENCED_OUT, "a", 1)


def test_heartbeat_renews_only_the_leases_of_runs_this_node_executes(ledger):
    from django_cluster_jobs.coordination import NodeStats
    from tests.factories import WorkerNodeFactory

    WorkerNodeFactory(node_id="a")
    mine = RunningRunFactory(node="a")
    theirs = RunningRunFactory(node="b", lease_expires_at=LEASE)
    done = RunningRunFactory(node="a", state=RunState.SUCCEEDED, lease_expires_at=LEASE)
    later = LEASE + timedelta(minutes=1)
    orphan = RunningRunFactory(node="a", lease_expires_at=LEASE)  # claimed, never started here
    # 8.7: taken over meanwhile under a higher fence by a process with the same node id.
    stale = RunningRunFactory(node="a", fence=3, lease_expires_at=LEASE)
    stats = NodeStats(1.5, 3, 2, {"claimed_elsewhere": 2})
    sent = [(mine.pk, mine.fence), (done.pk, done.fence), (theirs.pk, theirs.fence)]
    beat = ledger.vendor.heartbeat("a", NOW, later, stats, [*sent, (stale.pk, 2)])
    assert beat.owned_runs == {mine.pk} and beat.status == "active"
    values = dict(JobRun.objects.values_list("pk", "lease_expires_at"))
    assert values == {
        mine.pk: later,
        theirs.pk: LEASE,
        done.pk: LEASE,
        orphan.pk: LEASE,
        stale.pk: LEASE,
    }
    from django_cluster_jobs.models import WorkerNode

    node = WorkerNode.objects.get(node_id="a")
    assert (node.last_heartbeat, node.claims_won, node.skipped) == (
        NOW,
        3,
        {"claimed_elsewhere": 2},
    )


#: Per database, lease expiries a column holds that Python cannot read, and the earliest
#: expiry a heartbeat then reads: PostgreSQL's infinities, read as the nearest end of
#: Python's instants (-infinity is due at once; infinity leaves the node's own lease the
#: earliest, None here).
EXTREME_LEASES = {
    "postgresql": [("CAST('-infinity' AS timestamptz)", EARLIEST_RUN_AT),
                   ("CAST('infinity' AS timestamptz)", None)],
}  # fmt: skip


@pytest.mark.parametrize("extreme", [0, 1])
def test_a_lease_python_cannot_read_leaves_every_heartbeat_working(ledger, extreme):
    """Item 5 of the second containment round: such a lease (another node's) made every
    heartbeat of every node fail."""
    from django_cluster_jobs.coordination import NodeStats
    from tests.factories import WorkerNodeFactory
    from tests.raw_rows import store_raw

    leases = EXTREME_LEASES.get(connection.vendor, [])
    if extreme >= len(leases):
        pytest.skip(f"{connection.vendor} holds no lease Python cannot read")
    literal, earliest = leases[extreme]
    WorkerNodeFactory(node_id="a")
    mine = RunningRunFactory(node="a", lease_expires_at=LEASE)
    odd = RunningRunFactory(node="b", lease_expires_at=LEASE)
    store_raw(JobRun, odd.pk, "lease_expires_at", literal)
    later = LEASE + timedelta(minutes=1)
    beat = ledger.vendor.heartbeat("a", NOW, later, NodeStats(0, 0, 0, {}), [(mine.pk, 1)])
    assert beat.owned_runs == {mine.pk} and beat.status == "active"
    # The node's own lease as the heartbeat reads it: before its renewal in the native
    # statement (one snapshot), after it on the portable path (statements one after another).
    own = LEASE if ledger.vendor.name == "postgresql" else later
    assert beat.next_expiry == (own if earliest is None else earliest)


def test_a_heartbeat_with_no_running_run_reads_no_expiry(ledger):
    from django_cluster_jobs.coordination import NodeStats
    from tests.factories import WorkerNodeFactory

    WorkerNodeFactory(node_id="a")
    assert ledger.vendor.heartbeat("a", NOW, LEASE, NodeStats(0, 0, 0, {}), []).next_expiry is None


def test_a_postgresql_heartbeat_brings_the_database_clock_back(ledger):
    """The native PostgreSQL heartbeat reads the clock in its own statement; others do not."""
    from django_cluster_jobs.coordination import NodeStats
    from tests.factories import WorkerNodeFactory

    WorkerNodeFactory(node_id="a")
    before = datetime.now(UTC)
    beat = ledger.vendor.heartbeat("a", NOW, LEASE, NodeStats(0, 0, 0, {}), [])
    if ledger.vendor.name == "postgresql":
        # One machine: the database's clock is this one, within the round trip and a margin.
        margin = timedelta(seconds=1)
        assert before - margin <= beat.db_time <= datetime.now(UTC) + margin
    else:
        assert beat.db_time is None


def test_db_now_is_the_database_clock(ledger):
    from tests.factories import WorkerNodeFactory

    WorkerNodeFactory()
    assert abs(ledger.vendor.db_now() - datetime.now(UTC)) < timedelta(seconds=2)

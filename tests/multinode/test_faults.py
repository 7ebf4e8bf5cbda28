"""Crashes, pauses, outages and skew under real scheduler processes."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_cluster_jobs import services
from django_cluster_jobs.conf import app_settings
from django_cluster_jobs.coordination import get_vendor
from django_cluster_jobs.engine.claimer import MISFIRE_GRACE
from django_cluster_jobs.engine.leader import CATCH_UP_EVERY
from django_cluster_jobs.engine.presence import LOOK
from django_cluster_jobs.models import (
    Cause,
    ClusterEvent,
    EventKind,
    JobRun,
    Lease,
    NodeStatus,
    RunState,
    WorkerNode,
)
from tests import timing
from tests.conftest import Scheduler, wait_until
from tests.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

_features = get_vendor().features
#: Death as an event: PostgreSQL's session locks, or SQLite's processes on one host. Elsewhere
#: (MariaDB, MySQL: the ORM path) a dead node's runs are freed at lease expiry, which
#: test_killed_owner_without_presence_is_released_at_lease_expiry proves on every database.
needs_presence = pytest.mark.skipif(
    not (_features.session_locks or _features.clock_is_local),
    reason=f"{connection.vendor} has no presence (death as an event): a dead node's runs are "
    "freed at lease expiry (test_killed_owner_without_presence_is_released_at_lease_expiry)",
)


def running_on(run: JobRun) -> str | None:
    run.refresh_from_db()
    return (
        run.node
        if run.state == RunState.RUNNING
        and Effect.objects.filter(key=run.key, node=run.node).exists()
        else None
    )


def two_nodes(start_scheduler, **env):
    return {n: start_scheduler(n, "--duration", SERVES, **env) for n in ("x", "y")}


def said(node: Scheduler, text: str) -> bool:
    return text in node.output()


def pause_between_writes(node, run: JobRun) -> None:
    """SIGSTOP ``node`` at an instant it holds no lock another node needs to take ``run`` over.

    A process paused inside a write transaction keeps its locks until it resumes: on SQLite the
    database's only writer lock, on PostgreSQL the rows it was updating (its runs' leases, the
    leader lease). Nobody can take those over meanwhile; that is how both databases work, and the
    guarantees page says so. This test is about fencing a paused owner, so it pauses the node
    between two of its transactions, letting it run on for a moment when a pause landed inside one.
    """
    for _ in range(50):
        node.signal(signal.SIGSTOP)
        if _takeover_locks_free(run):
            return
        node.signal(signal.SIGCONT)
        timing.pause(RUN_ON)
    pytest.fail("could not pause the node between two of its write transactions")


def _takeover_locks_free(run: JobRun) -> bool:
    if connection.vendor == "sqlite":
        import sqlite3

        db = sqlite3.connect(
            connection.settings_dict["NAME"], timeout=LOCK_WAIT, isolation_level=None
        )
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:  # "database is locked": the paused node holds it
            return False
        finally:
            db.close()
    from django.db import DatabaseError, transaction

    try:
        with transaction.atomic():
            for rows in (JobRun.objects.filter(pk=run.pk), Lease.objects.all(), WorkerNode.objects):
                list(rows.select_for_update(nowait=True).values_list("pk", flat=True))
            transaction.set_rollback(True)
    except DatabaseError:  # a row lock held by the paused node
        return False
    return True


def kinds(run: JobRun) -> list[str]:
    return list(run.events.values_list("kind", flat=True))


#: A node's --duration where the test ends it itself (kill, SIGTERM, teardown): it serves through
#: every wait of the test, and its process (start, serve, exit) still ends within its deadline.
SERVES = f"{timing.PROCESS_LIFE - timing.NODE_START - timing.NODE_EXIT:g}"
#: A run lease and a node's silence before it is dead (tests/settings.py scales them) far longer
#: than TAKEOVER_DEADLINE: a takeover within that came from presence or a hand-back, not expiry.
LONG_LEASE = {"CLUSTER_JOBS_LEASE_TTL": "60", "CLUSTER_JOBS_DEAD_AFTER": "60"}
#: A killed node's runs are released at once (PostgreSQL: its session's lock) or at a peer's next
#: look at its process (SQLite, every LOOK seconds); the survivor then takes the pending run as it
#: takes any, within REACT. Far below the long lease.
TAKEOVER_DEADLINE = LOOK + timing.REACT
#: How long a node paused inside one of its write transactions is let run on before it is paused
#: again: a healthy node's transaction takes milliseconds.
RUN_ON = timing.scaled(0.02)
#: How long a probe waits for SQLite's writer lock: a live node's write transaction ends within
#: it (milliseconds), a paused node's never does.
LOCK_WAIT = timing.scaled(1.0)
#: What a loaded machine adds to a leader failover's TTL and heartbeat: the candidate's heartbeat
#: runs late and its statement waits its turn, and this process polls for the new holder.
FAILOVER_ALLOWANCE = timing.scaled(2)
#: The outage of the database, through the proxy: several occurrences of a per-second job.
OUTAGE = timing.scaled(5)
#: How long the skewed node and the normal one serve (their --duration): a dozen occurrences of a
#: per-second job and a run of tests.long (CLUSTER_JOBS_TEST_LONG) on either node.
SKEWED_SERVES, NORMAL_SERVES = timing.scaled(14), timing.scaled(12)
#: How far a node's measured clock offset may be off: half a round trip to the database, which
#: stays well under a second on a loaded machine.
CLOCK_ERROR_MS = timing.scaled(0.5) * 1000


def released_at_expiry() -> float:
    """Seconds until the runs of a node that stopped renewing (paused, or killed without
    presence) are pending again, at the latest: its leases expire, after the leader lease when it
    led and another node had to take that first, and the leader's next chores release them."""
    s = app_settings
    return s.LEASE_TTL + s.LEADER_TTL + timing.REACT


def noticed_dead() -> float:
    """Seconds until a killed node is marked dead, at the latest: at once by presence, else at
    DEAD_AFTER, after the leader lease when it led and another node had to take that first."""
    s = app_settings
    return s.DEAD_AFTER + s.LEADER_TTL + timing.REACT


def settled_after_outage() -> float:
    """Seconds from the end of an outage until the leader settled its occurrences, at the
    latest: no node will claim them any more (the misfire grace and a heartbeat), then the
    leader's next catch-up pass."""
    s = app_settings
    grace = MISFIRE_GRACE.total_seconds() + s.HEARTBEAT_INTERVAL
    return grace + CATCH_UP_EVERY * s.HEARTBEAT_INTERVAL + timing.REACT


def whole_seconds_between(start: datetime, end: datetime) -> set[datetime]:
    """The occurrences of a per-second job strictly between two instants."""
    at = start.replace(microsecond=0) + timedelta(seconds=1)
    seconds = set()
    while at < end:
        seconds.add(at)
        at += timedelta(seconds=1)
    return seconds


def failover() -> float:
    """The promise: a new leader within the leader lease's TTL plus a heartbeat (presence frees
    a killed leader's lease at once; without it the lease expires)."""
    s = app_settings
    return s.LEADER_TTL + s.HEARTBEAT_INTERVAL + FAILOVER_ALLOWANCE


@needs_presence
def test_killed_owner_at_least_once_run_is_taken_over_at_once(start_scheduler):
    """Presence: the killed node's session (PostgreSQL) or process (SQLite) ends, and a peer
    releases its run long before the long lease could expire."""
    nodes = two_nodes(start_scheduler, jobs="every_second", **LONG_LEASE)
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 2, timing.NODE_START)
    run = services.enqueue("tests.long")
    owner = wait_until(lambda: running_on(run), timing.REACT)
    first_fence = JobRun.objects.get(pk=run.pk).fence
    survivor = "y" if owner == "x" else "x"
    nodes[owner].kill()
    killed_at = timezone.now()
    wait_until(lambda: JobRun.objects.filter(pk=run.pk, node=survivor, attempt=2).exists(),
               TAKEOVER_DEADLINE)  # fmt: skip
    assert WorkerNode.objects.get(node_id=owner).status == NodeStatus.DEAD
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timing.RUN_ENDS)
    run.refresh_from_db()
    assert (run.attempt, run.node) == (2, survivor)
    assert run.fence > first_fence and run.result == {"node": survivor, "attempt": 2}
    assert EventKind.NODE_LOST in kinds(run) and EventKind.TAKEN_OVER in kinds(run)
    released = run.events.get(kind=EventKind.NODE_LOST)
    assert released.node == survivor and f"node {owner} ended" in released.reason
    # The next occurrences keep firing on the survivor.
    later = JobRun.objects.filter(
        job__name="tests.every_second",
        node=survivor,
        scheduled_at__gt=killed_at + timedelta(seconds=1),
    )
    wait_until(later.exists, timing.REACT)


@needs_presence
def test_killed_owner_at_most_once_run_is_lost_not_rerun(start_scheduler):
    nodes = two_nodes(start_scheduler, **LONG_LEASE)
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 2, timing.NODE_START)
    run = services.enqueue("tests.long_once")
    owner = wait_until(lambda: running_on(run), timing.REACT)
    nodes[owner].kill()
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.LOST, TAKEOVER_DEADLINE)
    # The survivor takes and ends a run enqueued after the loss: a wrongful re-run of the lost
    # one, which would be pending before it, would have been taken first.
    nxt = services.enqueue("tests.manual", {"value": 1})
    wait_until(lambda: JobRun.objects.get(pk=nxt.pk).state == RunState.SUCCEEDED, timing.RUN_ENDS)
    run.refresh_from_db()
    assert run.attempt == 1 and run.state == RunState.LOST
    assert f"node {owner} ended" in run.reason
    assert Effect.objects.filter(key=run.key).count() == 1, "an at-most-once run ran again"
    assert EventKind.LOST in kinds(run)


@needs_presence
def test_a_restarted_node_releases_what_its_killed_process_left_running(start_scheduler):
    """A single node killed and started again with the same id: no peer saw it die, and its
    new process releases the old one's run as it starts, not when the long lease expires."""
    first = start_scheduler("solo", "--duration", SERVES, **LONG_LEASE)
    solo = WorkerNode.objects.filter(node_id="solo", status="active")
    wait_until(solo.exists, timing.NODE_START)
    run = services.enqueue("tests.long")
    wait_until(lambda: running_on(run), timing.REACT)
    first.kill()
    start_scheduler("solo", "--duration", SERVES, **LONG_LEASE)
    retaken = JobRun.objects.filter(pk=run.pk, attempt=2)
    wait_until(retaken.exists, timing.NODE_START + timing.REACT)
    released = run.events.get(kind=EventKind.NODE_LOST)
    assert "previous one ended" in released.reason
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timing.RUN_ENDS)
    assert JobRun.objects.get(pk=run.pk).attempt == 2


def test_killed_owner_without_presence_is_released_at_lease_expiry(start_scheduler):
    """PRESENCE off (behind a pooler in transaction mode): the lease still recovers the run."""
    nodes = two_nodes(start_scheduler, CLUSTER_JOBS_TEST_PRESENCE="0")
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 2, timing.NODE_START)
    run = services.enqueue("tests.long")
    owner = wait_until(lambda: running_on(run), timing.REACT)
    nodes[owner].kill()
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED,
               released_at_expiry() + timing.RUN_ENDS)  # fmt: skip
    run.refresh_from_db()
    assert run.attempt == 2 and EventKind.LEASE_EXPIRED in kinds(run)
    assert EventKind.NODE_LOST not in kinds(run)


@pytest.mark.postgresql
def test_a_node_cut_from_its_presence_session_loses_its_runs_to_fencing(start_scheduler):
    """A partition of the presence session alone: a peer releases the run at once (either node
    may take it again: the cut one lives on); the cut node cancels its first attempt's handler
    at its next heartbeat, and that attempt's late write is fenced out. The run is released
    once: the cut node is not taken for dead again while it takes its lock back."""
    nodes = two_nodes(start_scheduler, CLUSTER_JOBS_TEST_LONG="6", **LONG_LEASE)
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 2, timing.NODE_START)
    run = services.enqueue("tests.long")
    owner = wait_until(lambda: running_on(run), timing.REACT)
    owner_fence = JobRun.objects.get(pk=run.pk).fence
    other = "y" if owner == "x" else "x"
    process_before = WorkerNode.objects.get(node_id=owner).process
    with connection.cursor() as cursor:
        # This database's sessions only: another suite on the same server names its nodes alike.
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [f"cluster-jobs-hold:{owner}"],
        )
        assert cursor.fetchall() == [(True,)], "no presence session to cut"
    wait_until(lambda: JobRun.objects.filter(pk=run.pk, attempt=2).exists(), TAKEOVER_DEADLINE)
    # The first attempt's handler ignores the cancel: its write comes when it ends.
    fenced = wait_until(
        lambda: run.events.filter(kind=EventKind.FENCED_OUT, node=owner, fence=owner_fence).first(),
        timing.RUN_ENDS,
    )
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timing.RUN_ENDS)
    run.refresh_from_db()
    assert run.attempt == 2 and run.result == {"node": run.node, "attempt": 2}
    assert fenced.fence < run.fence
    wait_until(lambda: said(nodes[owner], "lost its presence session"), timing.REACT)
    # The cut node takes its lock again, under a new process identity, and goes on: it is
    # active, watched again, and was released once only in all that time.
    wait_until(lambda: WorkerNode.objects.filter(node_id=owner, status=NodeStatus.ACTIVE)
               .exclude(process=process_before).exists(), timing.REACT)  # fmt: skip
    released = run.events.filter(kind=EventKind.NODE_LOST)
    assert list(released.values_list("node", flat=True)) == [other], "released more than once"


def test_paused_owner_is_fenced_out_when_it_wakes(start_scheduler):
    nodes = two_nodes(start_scheduler, CLUSTER_JOBS_TEST_LONG="4")
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 2, timing.NODE_START)
    run = services.enqueue("tests.long")
    owner = wait_until(lambda: running_on(run), timing.REACT)
    owner_fence = JobRun.objects.get(pk=run.pk).fence
    other = "y" if owner == "x" else "x"
    pause_between_writes(nodes[owner], run)
    try:
        taken = JobRun.objects.filter(pk=run.pk, node=other, attempt=2)
        wait_until(taken.exists, released_at_expiry())
    finally:
        nodes[owner].signal(signal.SIGCONT)
    # Awake, the owner's handler runs to its end (it ignores the cancel) and writes too late.
    fenced = wait_until(
        lambda: run.events.filter(kind=EventKind.FENCED_OUT, node=owner).first(), timing.RUN_ENDS
    )
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timing.RUN_ENDS)
    run.refresh_from_db()
    assert run.node == other and run.result == {"node": other, "attempt": 2}
    assert fenced.fence == owner_fence and run.fence > owner_fence
    wait_until(lambda: said(nodes[owner], "fenced out"), timing.REACT)


def test_leader_failover_within_the_lease_ttl(start_scheduler):
    nodes = {n: start_scheduler(n, "--duration", SERVES) for n in ("a", "b", "c")}
    held = Lease.objects.filter(name="leader").exclude(holder="")
    lease = wait_until(held.first, timing.NODE_START)
    old_holder, old_fence = lease.holder, lease.fence
    nodes[old_holder].kill()
    new = wait_until(held.exclude(holder=old_holder).first, failover())
    assert new.fence > old_fence
    acquired = ClusterEvent.objects.filter(kind="leader_acquired", node=new.holder, fence=new.fence)
    assert acquired.exists(), "the change of leader was committed without its record"


def test_dead_node_is_marked_dead_by_the_leader(start_scheduler):
    nodes = two_nodes(start_scheduler)
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 2, timing.NODE_START)
    nodes["x"].kill()
    dead = WorkerNode.objects.filter(node_id="x", status=NodeStatus.DEAD)
    wait_until(dead.exists, noticed_dead())
    assert ClusterEvent.objects.filter(kind="node_dead", node="x").exists()
    assert WorkerNode.objects.get(node_id="y").status == NodeStatus.ACTIVE


def test_drain_hands_back_what_cannot_finish(start_scheduler):
    """A draining node hands back the run it cannot finish within its grace period, and the
    other node takes it over at once: with the long lease, not an expiry."""
    nodes = two_nodes(
        start_scheduler, CLUSTER_JOBS_GRACE="1", CLUSTER_JOBS_TEST_LONG="6", **LONG_LEASE
    )
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 2, timing.NODE_START)
    run = services.enqueue("tests.long")
    owner = wait_until(lambda: running_on(run), timing.REACT)
    other = "y" if owner == "x" else "x"
    assert services.request_drain([owner]) == 1
    assert nodes[owner].wait(timeout=timing.NODE_EXIT) == 0
    assert WorkerNode.objects.get(node_id=owner).status == NodeStatus.STOPPED
    taken = JobRun.objects.filter(pk=run.pk, node=other, attempt=2)
    wait_until(taken.exists, timing.REACT)
    run.refresh_from_db()
    assert run.cause == Cause.HANDED_BACK, "taken over otherwise than by the hand-back"
    assert EventKind.HANDED_BACK in kinds(run) and EventKind.TAKEN_OVER in kinds(run)
    assert EventKind.LEASE_EXPIRED not in kinds(run) and EventKind.NODE_LOST not in kinds(run)
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.SUCCEEDED, timing.RUN_ENDS)


@pytest.mark.parametrize("skew", ["300", "-300"])
def test_a_skewed_node_neither_double_runs_nor_steals_a_lease(start_scheduler, skew):
    since = timezone.now().replace(microsecond=0)
    skewed = start_scheduler(
        "skewed", "--duration", f"{SKEWED_SERVES:g}", jobs="every_second",
        CLUSTER_JOBS_TEST_SKEW=skew,
    )  # fmt: skip
    runs = JobRun.objects.filter(job__name="tests.every_second")
    leads = Lease.objects.filter(name="leader", holder="skewed")
    # The skewed node leads and fires on its own first, before the other node can take part.
    wait_until(lambda: leads.exists() and runs.filter(node="skewed").exists(), timing.NODE_START)
    normal = start_scheduler(
        "normal", "--duration", f"{NORMAL_SERVES:g}", jobs="every_second",
        CLUSTER_JOBS_TEST_LONG="5",
    )  # fmt: skip
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 2, timing.NODE_START)
    run = services.enqueue("tests.long")
    for node in (skewed, normal):
        assert node.wait(timeout=SKEWED_SERVES + timing.NODE_EXIT) == 0, node.output()
    until = timezone.now()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.attempt == 1, "a live lease was stolen"
    every = sorted(runs.values_list("scheduled_at", flat=True))
    assert len(every) == len(set(every)) >= 8
    # Occurrences named by cluster time, not by the skewed node's clock.
    assert all(since <= at <= until for at in every), (since, until, every)
    # What the unique constraint does not give: each handler ran once, and none started before
    # its occurrence by cluster time, on the skewed node as on the other. An occurrence skipped
    # because the previous run outlived its second (overlap "skip") ran nothing and started never.
    ran = runs.exclude(state=RunState.SKIPPED)
    effects = Effect.objects.filter(job="tests.every_second").values_list("key", flat=True)
    assert sorted(effects) == sorted(ran.values_list("key", flat=True))
    early = [(r.key, r.node, r.started_at) for r in ran if r.started_at < r.scheduled_at]
    assert not early, early
    offset = WorkerNode.objects.get(node_id="skewed").clock_offset_ms
    assert abs(offset + float(skew) * 1000) < CLOCK_ERROR_MS


@pytest.mark.postgresql
def test_database_outage_fails_closed_and_resumes_without_restart(start_scheduler):
    from tests.conftest import database_url
    from tests.proxy import Proxy

    s = connection.settings_dict
    proxy = Proxy(s.get("HOST") or "127.0.0.1", int(s.get("PORT") or 5432))
    url = database_url().replace(f":{s.get('PORT') or 5432}/", f":{proxy.port}/")
    if f":{proxy.port}/" not in url:
        url = url.replace(f"@{s.get('HOST') or '127.0.0.1'}/", f"@127.0.0.1:{proxy.port}/")
    runs = JobRun.objects.filter(job__name="tests.every_second")
    try:
        nodes = [
            start_scheduler(
                n,
                "--duration",
                SERVES,
                jobs="every_second",
                DATABASE_URL=url,
                CLUSTER_JOBS_LEASE_TTL="15",
            )
            for n in ("p", "q", "r")
        ]
        active = WorkerNode.objects.filter(status="active")
        wait_until(lambda: active.count() == len(nodes), timing.NODE_START)
        wait_until(lambda: runs.count() >= 3, timing.FEW_SECONDS_OF_RUNS)
        proxy.cut()
        cut_at = timezone.now()
        timing.pause(OUTAGE)
        proxy.restore()
        restored_at = timezone.now()
        # The cluster fires again, and every node is back on the database, none restarted.
        resumed = runs.filter(scheduled_at__gt=restored_at + timedelta(seconds=2))
        wait_until(lambda: resumed.count() >= 3, timing.FEW_SECONDS_OF_RUNS)
        back = active.filter(last_heartbeat__gt=restored_at)
        wait_until(lambda: back.count() == len(nodes), timing.REACT)
        assert dict(back.values_list("node_id", "pid")) == {n.node_id: n.proc.pid for n in nodes}
        # The leader settles the gap afterwards (misfire policy fire_once): one row per
        # occurrence of the outage, each with its outcome (missed, or the latest run late).
        gap = whole_seconds_between(
            cut_at + timedelta(seconds=1), restored_at - timedelta(seconds=1)
        )
        during = runs.filter(scheduled_at__in=gap)
        wait_until(lambda: during.count() == len(gap), settled_after_outage())
        for node in nodes:
            node.signal(signal.SIGTERM)
        for node in nodes:
            assert node.wait(timeout=timing.NODE_EXIT) == 0, node.output()
    finally:
        proxy.close()
    effects = Effect.objects.filter(job="tests.every_second").values_list("key", flat=True)
    assert len(effects) == len(set(effects)), "an occurrence ran twice"
    assert not during.filter(outcome="won").exists(), "a node fired while the database was away"
    assert during.exclude(outcome__in=("missed", "catch_up")).count() == 0
    skipped = WorkerNode.objects.values_list("skipped", flat=True)
    assert sum(s.get("claim_failed", 0) for s in skipped) >= 3

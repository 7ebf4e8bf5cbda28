"""Pauses, disables and a wrong clock under real scheduler processes: nothing repeated or lost."""

from __future__ import annotations

import itertools
import signal
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_cluster_jobs import services
from django_cluster_jobs.conf import app_settings
from django_cluster_jobs.engine.claimer import MISFIRE_GRACE
from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    JobDefinition,
    JobRun,
    Lease,
    NodeStatus,
    Outcome,
    RunState,
    WorkerNode,
)
from tests import timing
from tests.conftest import wait_until
from tests.models import Effect
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, NODE_START, REACT, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

JOB = "tests.every_second"
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)
#: How far the test's clock and a node's cluster time (the database's clock as the node measured
#: it) may disagree.
CLOCK_ERROR = timedelta(seconds=scaled(0.1))
#: What a skip of the overlap policy "skip" (the default) records: the previous run is live.
OVERLAP_SKIP = "overlap: the previous run is still live"
#: How long the wrong clock's node and the others serve: past the leader's kill and failover.
SKEW_LIFE, SKEWED_LIFE = scaled(30), scaled(26)
#: How long the lease of the run taken before the leader's kill ages: a lease the node whose
#: clock is 5 minutes ahead would think expired long ago (LEASE_TTL is 3 s in the test settings).
LEASE_AGES = scaled(3)


def pause_length() -> float:
    """Longer than the leader's horizon (the claim grace and one heartbeat) by two heartbeats, so
    a leader that caught up a pause would have had time to."""
    return MISFIRE_GRACE.total_seconds() + 3 * app_settings.HEARTBEAT_INTERVAL


def next_second(instant: datetime) -> datetime:
    """The first whole second strictly after ``instant``: the next occurrence of JOB."""
    return instant.replace(microsecond=0) + timedelta(seconds=1)


def assert_ran_or_skipped_once(runs) -> None:
    """Each occurrence ran once and succeeded, or was skipped by the overlap policy (its
    previous run was still live on a slow machine) and ran nothing."""
    ran = runs.exclude(state=RunState.SKIPPED)
    assert set(ran.values_list("state", flat=True)) == {RunState.SUCCEEDED}, ledger()
    skips = runs.filter(state=RunState.SKIPPED).values_list("reason", flat=True)
    assert all(reason.startswith(OVERLAP_SKIP) for reason in skips), ledger()
    per_key = Counter(Effect.objects.filter(job=JOB).values_list("key", flat=True))
    assert set(per_key.values()) == {1}, f"an occurrence ran twice: {per_key}\n{ledger()}"
    assert set(per_key) == set(ran.values_list("key", flat=True)), ledger()


def ledger() -> str:
    fields = ("key", "state", "outcome", "node", "reason")
    rows = JobRun.objects.filter(job__name=JOB).order_by("scheduled_at").values_list(*fields)
    return "\n".join(" ".join(map(str, row)) for row in rows)


STOP_AND_START = {
    "pause": (lambda: services.pause(JOB), lambda: services.resume(JOB)),
    "disable": (
        lambda: services.set_enabled([JOB], enabled=False),
        lambda: services.set_enabled([JOB], enabled=True),
    ),
}


@pytest.mark.parametrize("change", STOP_AND_START)
def test_a_pause_is_neither_run_nor_recorded_and_firing_resumes_on_time(start_scheduler, change):
    """8.1: stop a per-second job for longer than the leader's horizon on two nodes, start it."""
    stop, start = STOP_AND_START[change]
    nodes = [
        start_scheduler(n, "--duration", f"{SERVES:g}", jobs="every_second") for n in ("p", "q")
    ]
    wait_until(lambda: JobRun.objects.filter(job__name=JOB).count() >= 3, FEW_SECONDS_OF_RUNS)
    stop()
    stopped = timezone.now()
    timing.pause(pause_length())  # the pause itself
    start()
    # The change's instant in cluster time: the mark it set (the leader moves a mark only up to
    # its horizon, seconds in the past, so this read sees the change's own).
    started = JobDefinition.objects.get(name=JOB).settled_through
    wait_until(
        lambda: JobRun.objects.filter(job__name=JOB, scheduled_at__gt=started).count() >= 4,
        FEW_SECONDS_OF_RUNS,
    )
    for node in nodes:
        node.signal(signal.SIGTERM)
    for node in nodes:
        assert node.wait(timeout=NODE_EXIT) == 0, node.output()

    runs = JobRun.objects.filter(job__name=JOB)
    during = runs.filter(scheduled_at__gt=stopped + CLOCK_ERROR, scheduled_at__lte=started)
    assert not during.exists(), ledger()
    assert not runs.exclude(outcome=Outcome.WON).exists(), ledger()
    assert_ran_or_skipped_once(runs)
    after = sorted(runs.filter(scheduled_at__gt=started).values_list("scheduled_at", flat=True))
    # The first occurrence after the change is claimed (late if the nodes re-planned after it,
    # within the claim grace; later, the leader would have settled it, not as won), and every
    # one after it.
    assert after[0] == next_second(started), ledger()
    gaps = [(a, b) for a, b in itertools.pairwise(after) if b - a != timedelta(seconds=1)]
    assert not gaps, ledger()


def test_a_node_whose_clock_is_wrong_does_no_harm_as_a_would_be_leader(start_scheduler):
    """8.9: a node whose whole view of time is five minutes ahead (a faked time: on SQLite the
    database's clock too) joins three others; then the leader dies."""
    env = {"jobs": "every_second", "CLUSTER_JOBS_TEST_LONG": "5"}
    normal = {n: start_scheduler(n, "--duration", f"{SKEW_LIFE:g}", **env) for n in "abc"}
    wait_until(lambda: Lease.objects.filter(name="leader").exclude(holder="").exists(), NODE_START)
    skewed = start_scheduler(
        "ahead", "--duration", f"{SKEWED_LIFE:g}", **env,
        CLUSTER_JOBS_TEST_CLOCK="tests.clocks.HostSkewedClock", CLUSTER_JOBS_TEST_SKEW="300",
    )  # fmt: skip
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 4, NODE_START)
    run = services.enqueue("tests.long")  # a live lease the wrong clock would think expired
    timing.pause(LEASE_AGES)
    leader = Lease.objects.get(name="leader").holder
    normal[leader].kill()
    killed = timezone.now()
    cfg = app_settings
    # Failover: the lease runs out (LEADER_TTL) and a survivor's next heartbeats take it.
    failover = cfg.LEADER_TTL + 2 * cfg.HEARTBEAT_INTERVAL + REACT
    wait_until(
        lambda: Lease.objects.filter(name="leader").exclude(holder__in=("", leader)).exists(),
        failover,
    )
    for node in [*normal.values(), skewed]:
        node.wait(timeout=NODE_START + SKEW_LIFE + NODE_EXIT)

    holders = set(ClusterEvent.objects.filter(kind=ClusterEventKind.LEADER_ACQUIRED)
                  .values_list("node", flat=True))  # fmt: skip
    if connection.vendor == "sqlite":  # on PostgreSQL the database's clock corrects it
        assert "ahead" not in holders, holders
        assert "does not lead: its clock disagrees" in skewed.output()
    dead = set(ClusterEvent.objects.filter(kind=ClusterEventKind.NODE_DEAD)
               .values_list("node", flat=True))  # fmt: skip
    assert dead <= {leader}, f"healthy nodes marked dead: {dead - {leader}}"
    assert not WorkerNode.objects.filter(node_id__in=set(normal) - {leader},
                                         status=NodeStatus.DEAD).exists()  # fmt: skip
    run.refresh_from_db()
    first_owner = run.events.filter(kind="started").order_by("at", "pk").first().node
    assert run.state == RunState.SUCCEEDED
    if first_owner != leader:  # only the run of the killed leader may be taken over
        assert run.attempt == 1, "a live lease was reaped"
    future = JobRun.objects.filter(state=RunState.MISSED, scheduled_at__gt=killed)
    assert not future.exists(), "missed rows recorded ahead of the other nodes' time"

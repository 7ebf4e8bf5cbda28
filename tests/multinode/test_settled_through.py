"""Pauses, disables and a wrong clock under real scheduler processes: nothing repeated or lost."""

from __future__ import annotations

import signal
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
from tests.ledger_checks import assert_every_occurrence_once, cluster_time_error, ledger_of
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, NODE_START, REACT, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

JOB = "tests.every_second"
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)
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


def ledger() -> str:
    return ledger_of(JOB)


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
    stopped = services.cluster_now()  # after the change's commit, on the database's clock
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
    # A claim after the stop's commit is refused in its own statement: an occurrence after the
    # stop was claimed before the commit, when the node's cluster time (off the database's clock
    # by its error at most) had reached it.
    stop_took = stopped + cluster_time_error()
    during = runs.filter(scheduled_at__gt=stop_took, scheduled_at__lte=started)
    assert not during.exists(), ledger()
    assert not runs.exclude(outcome=Outcome.WON).exists(), ledger()
    # Every second until the stop and every one from the start on has its one row (none missed,
    # none run twice, each skip naming a live run that ran).
    spans = ((None, stop_took), (started, None))
    assert_every_occurrence_once(JOB, step=timedelta(seconds=1), spans=spans, least=7)
    after = sorted(runs.filter(scheduled_at__gt=started).values_list("scheduled_at", flat=True))
    # The first occurrence after the change is claimed (late if the nodes re-planned after it,
    # within the claim grace; later, the leader would have settled it, not as won), and every
    # one after it.
    assert after[0] == next_second(started), ledger()


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

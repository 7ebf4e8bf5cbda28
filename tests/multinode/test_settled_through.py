"""Pauses, disables and a wrong clock under real scheduler processes: nothing repeated or lost."""

from __future__ import annotations

import itertools
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_cluster_jobs import services
from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    JobRun,
    Lease,
    NodeStatus,
    Outcome,
    RunState,
    WorkerNode,
)
from tests.conftest import wait_until
from tests.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

JOB = "tests.every_second"
#: Longer than the leader's horizon (grace 5 s + one heartbeat), so a leader that caught up a
#: pause would have had time to.
PAUSE = 7.0


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
    nodes = [start_scheduler(n, "--duration", "22", jobs="every_second") for n in ("p", "q")]
    wait_until(lambda: JobRun.objects.filter(job__name=JOB).count() >= 3, 30)
    stop()
    stopped = timezone.now()
    time.sleep(PAUSE)  # the pause itself
    start()
    started = timezone.now()
    wait_until(
        lambda: JobRun.objects.filter(job__name=JOB, scheduled_at__gt=started).count() >= 4, 15
    )
    for node in nodes:
        node.signal(signal.SIGTERM)
    for node in nodes:
        assert node.wait(timeout=30) == 0, node.output()

    runs = JobRun.objects.filter(job__name=JOB)
    during = runs.filter(scheduled_at__gt=stopped + timedelta(milliseconds=100),
                         scheduled_at__lte=started)  # fmt: skip
    assert not during.exists(), ledger()
    assert not runs.exclude(outcome=Outcome.WON).exists(), ledger()
    assert set(runs.values_list("state", flat=True)) == {RunState.SUCCEEDED}, ledger()
    after = sorted(runs.filter(scheduled_at__gt=started).values_list("scheduled_at", flat=True))
    # The first occurrence after the change runs (within the time nodes take to re-plan), and
    # every one after it.
    assert after[0] <= started + timedelta(seconds=2), ledger()
    gaps = [(a, b) for a, b in itertools.pairwise(after) if b - a != timedelta(seconds=1)]
    assert not gaps, ledger()
    keys = list(Effect.objects.filter(job=JOB).values_list("key", flat=True))
    assert len(keys) == len(set(keys)) == runs.count()


def test_a_node_whose_clock_is_wrong_does_no_harm_as_a_would_be_leader(start_scheduler):
    """8.9: a node whose whole view of time is five minutes ahead (a faked time: on SQLite the
    database's clock too) joins three others; then the leader dies."""
    env = {"jobs": "every_second", "CLUSTER_JOBS_TEST_LONG": "5"}
    normal = {n: start_scheduler(n, "--duration", "30", **env) for n in ("a", "b", "c")}
    wait_until(lambda: Lease.objects.filter(name="leader").exclude(holder="").exists(), 30)
    skewed = start_scheduler(
        "ahead", "--duration", "26", **env,
        CLUSTER_JOBS_TEST_CLOCK="tests.clocks.HostSkewedClock", CLUSTER_JOBS_TEST_SKEW="300",
    )  # fmt: skip
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 4, 30)
    run = services.enqueue("tests.long")  # a live lease the wrong clock would think expired
    time.sleep(3)
    leader = Lease.objects.get(name="leader").holder
    normal[leader].kill()
    killed = timezone.now()
    wait_until(
        lambda: Lease.objects.filter(name="leader").exclude(holder__in=("", leader)).exists(), 30
    )
    for node in [*normal.values(), skewed]:
        node.wait(timeout=45)

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

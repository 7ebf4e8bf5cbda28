"""A pending notification wakes the node it is for; a busy one passes it on at once, so a run
enqueued while one node is busy is taken by a free one without waiting for any poll."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Max

from django_cluster_jobs import services
from django_cluster_jobs.models import JobRun, NodeStatus, RunState, WorkerNode
from tests.conftest import wait_until
from tests.timing import NODE_START, REACT, RUN_ENDS, scaled

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multinode,
    pytest.mark.postgresql,
]

#: The nodes' poll interval, in seconds of the reference machine (the test settings scale it):
#: six times REACT, so a run taken within REACT of its enqueue was woken, not found by a poll.
POLL = "60"
#: How long a busy node's run holds its only thread (scaled by tests/jobs.py): past the second
#: run's start and end.
HOLD = "30"
#: A node the test never stops serves at most this long (it is killed at teardown): longer than
#: the test's waits on a healthy cluster, and within PROCESS_LIFE with its start.
SERVES = scaled(60)


def both_see_each_other(nodes) -> None:
    """Wait until both nodes are active and each heartbeat since then (which reads the live
    nodes in the same statement) saw both."""
    active = WorkerNode.objects.filter(node_id__in=nodes, status=NodeStatus.ACTIVE)
    wait_until(lambda: active.count() == len(nodes), timeout=NODE_START)
    since = active.aggregate(Max("last_heartbeat"))["last_heartbeat__max"]
    wait_until(lambda: active.filter(last_heartbeat__gt=since).count() == len(nodes), REACT)


def started_by(run: JobRun) -> str:
    """Wait (at most REACT, far less than a poll interval) until ``run`` is taken; return the
    node that took it."""
    return wait_until(
        lambda: (
            JobRun.objects.filter(pk=run.pk, started_at__isnull=False)
            .values_list("node", flat=True)
            .first()
        ),
        timeout=REACT,
        interval=0.02,
    )


def test_a_run_enqueued_while_its_node_is_busy_is_taken_by_the_free_one(start_scheduler):
    names = ("wake-a", "wake-b")
    for name in names:
        start_scheduler(name, "--threads", "1", "--duration", f"{SERVES:g}",
                        CLUSTER_JOBS_TEST_POLL=POLL, CLUSTER_JOBS_TEST_LONG=HOLD)  # fmt: skip
    both_see_each_other(names)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    chosen = sorted(names)[pid % 2]  # the node this connection's notifications are for
    other = next(name for name in names if name != chosen)

    busy = services.enqueue("tests.long")
    assert started_by(busy) == chosen  # one node woken, the one the notification is for

    run = services.enqueue("tests.manual", {"value": 1})
    assert started_by(run) == other  # the busy node passed it on
    wait_until(
        lambda: JobRun.objects.filter(pk=run.pk, state=RunState.SUCCEEDED).exists(), RUN_ENDS
    )
    # The chosen node was busy when the run was taken: its only thread held the long run.
    busy.refresh_from_db()
    taken = JobRun.objects.get(pk=run.pk).started_at
    assert busy.finished_at is None or busy.finished_at > taken, (busy.state, busy.finished_at)

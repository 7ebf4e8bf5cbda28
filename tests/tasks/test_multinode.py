"""Tasks under real runscheduler processes: a node killed mid-task, several nodes at once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from django_cluster_jobs.conf import app_settings
from django_cluster_jobs.models import JobRun, RunEvent, RunState
from django_cluster_jobs.tasks.compat import TaskResultStatus
from tests import task_defs
from tests.conftest import wait_until
from tests.timing import NODE_EXIT, NODE_START, REACT, RUN_ENDS, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(50)


def released_and_ended() -> float:
    """How long a healthy cluster may take, from the start of a new node, to release what a
    killed node held (at once by presence, else when its lease expires: LEASE_TTL) and to end
    the run there, or record it lost."""
    return NODE_START + app_settings.LEASE_TTL + REACT


def test_a_node_killed_mid_task_has_it_taken_over_and_finished(start_scheduler, tmp_path: Path):
    marker = tmp_path / "slow"
    first = start_scheduler("first", "--duration", f"{SERVES:g}")
    result = task_defs.slow.enqueue(str(marker), 120)
    # The first attempt is inside the task's function.
    wait_until(marker.exists, NODE_START + REACT)
    run = JobRun.objects.get(pk=int(result.id))
    assert run.state == RunState.RUNNING and run.node == "first"
    first.signal(signal.SIGKILL)
    first.wait(NODE_EXIT)
    second = start_scheduler("second", "--duration", f"{SERVES:g}")

    def done():
        result.refresh()
        return result.is_finished

    wait_until(done, released_and_ended())
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value != int(marker.read_text())  # the second process returned it
    assert result.attempts == 2 and result.worker_ids == ["first", "second"]
    assert result.errors == []  # a killed attempt raised nothing
    second.signal(signal.SIGTERM)
    assert second.wait(NODE_EXIT) == 0


def test_tasks_enqueued_while_three_nodes_run_are_each_run_once(start_scheduler):
    nodes = [start_scheduler(n, "--duration", f"{SERVES:g}") for n in ("a", "b", "c")]
    results = [task_defs.add.enqueue(i, b=1) for i in range(30)]

    def all_done():
        return all((r.refresh() or r.is_finished) for r in results)

    wait_until(all_done, NODE_START + RUN_ENDS)  # 30 tiny tasks on 12 threads
    assert [r.return_value for r in results] == [i + 1 for i in range(30)]
    twice = {
        r.id: list(RunEvent.objects.filter(run_id=int(r.id)).values_list("kind", "node", "reason"))
        for r in results
        if r.attempts != 1
    }
    assert not twice, f"runs started more than once: {twice}"
    assert {w for r in results for w in r.worker_ids} <= {"a", "b", "c"}
    for node in nodes:
        node.signal(signal.SIGTERM)
    for node in nodes:
        assert node.wait(NODE_EXIT) == 0


def test_an_at_most_once_task_whose_node_dies_is_failed_lost(start_scheduler, tmp_path: Path):
    marker = tmp_path / "once"
    first = start_scheduler("first", "--duration", f"{SERVES:g}")
    result = task_defs.slow_once.enqueue(str(marker), 120)
    wait_until(marker.exists, NODE_START + REACT)
    first.signal(signal.SIGKILL)
    first.wait(NODE_EXIT)
    second = start_scheduler("second", "--duration", f"{SERVES:g}")

    def done():
        result.refresh()
        return result.is_finished

    wait_until(done, released_and_ended())
    assert result.status == TaskResultStatus.FAILED
    assert JobRun.objects.get(pk=int(result.id)).state == RunState.LOST
    [error] = result.errors
    assert error.exception_class_path == "django_cluster_jobs.tasks.results.TaskLost"
    assert result.worker_ids == ["first"]  # never run again
    second.signal(signal.SIGTERM)
    assert second.wait(NODE_EXIT) == 0

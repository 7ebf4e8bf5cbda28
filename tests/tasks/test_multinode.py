"""Tasks under real runscheduler processes: a node killed mid-task, several nodes at once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from django_cluster_jobs.models import JobRun, RunEvent, RunState
from django_cluster_jobs.tasks.compat import TaskResultStatus
from tests import task_defs
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

#: Longest wait for what a test waits on (processes starting, a lease expiring, a busy machine).
DEADLINE = 45.0


def test_a_node_killed_mid_task_has_it_taken_over_and_finished(start_scheduler, tmp_path: Path):
    marker = tmp_path / "slow"
    first = start_scheduler("first", "--duration", "50")
    result = task_defs.slow.enqueue(str(marker), 120)
    wait_until(marker.exists, DEADLINE)  # the first attempt is inside the task's function
    run = JobRun.objects.get(pk=int(result.id))
    assert run.state == RunState.RUNNING and run.node == "first"
    first.signal(signal.SIGKILL)
    first.wait(DEADLINE)
    second = start_scheduler("second", "--duration", "50")

    def done():
        result.refresh()
        return result.is_finished

    wait_until(done, DEADLINE)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value != int(marker.read_text())  # the second process returned it
    assert result.attempts == 2 and result.worker_ids == ["first", "second"]
    assert result.errors == []  # a killed attempt raised nothing
    second.signal(signal.SIGTERM)
    assert second.wait(DEADLINE) == 0


def test_tasks_enqueued_while_three_nodes_run_are_each_run_once(start_scheduler):
    nodes = [start_scheduler(n, "--duration", "50") for n in ("a", "b", "c")]
    results = [task_defs.add.enqueue(i, b=1) for i in range(30)]

    def all_done():
        return all((r.refresh() or r.is_finished) for r in results)

    wait_until(all_done, DEADLINE)
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
        assert node.wait(DEADLINE) == 0


def test_an_at_most_once_task_whose_node_dies_is_failed_lost(start_scheduler, tmp_path: Path):
    marker = tmp_path / "once"
    first = start_scheduler("first", "--duration", "50")
    result = task_defs.slow_once.enqueue(str(marker), 120)
    wait_until(marker.exists, DEADLINE)
    first.signal(signal.SIGKILL)
    first.wait(DEADLINE)
    second = start_scheduler("second", "--duration", "50")

    def done():
        result.refresh()
        return result.is_finished

    wait_until(done, DEADLINE)
    assert result.status == TaskResultStatus.FAILED
    assert JobRun.objects.get(pk=int(result.id)).state == RunState.LOST
    [error] = result.errors
    assert error.exception_class_path == "django_cluster_jobs.tasks.results.TaskLost"
    assert result.worker_ids == ["first"]  # never run again
    second.signal(signal.SIGTERM)
    assert second.wait(DEADLINE) == 0

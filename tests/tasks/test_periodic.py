"""Periodic tasks: a Task declared with schedule() runs once per occurrence, as a job does."""

from __future__ import annotations

import pytest

from django_cluster_jobs import services
from django_cluster_jobs.exceptions import ImproperlyDeclared, InvalidPayload
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from django_cluster_jobs.tasks.compat import TaskResultStatus, task_backends
from django_cluster_jobs.tasks.periodic import schedule
from tests import task_defs, timing
from tests.conftest import wait_until
from tests.tasks.test_backend import Running

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "tests.task_defs.add_every_second"


@pytest.mark.timing  # a per-second task, run by a live node
def test_a_scheduled_task_runs_each_occurrence_once_with_its_arguments():
    running = Running()
    try:
        # the node copies the code's definitions as it starts
        wait_until(lambda: JobDefinition.objects.filter(name=NAME).exists(), timing.NODE_START)
        definition = JobDefinition.objects.get(name=NAME)
        assert definition.cron == "* * * * * *" and not definition.enabled
        assert definition.payload == {"args": [40], "kwargs": {"b": 2}}
        services.set_enabled([NAME], enabled=True, by="test")
        runs = JobRun.objects.filter(job__name=NAME, state=RunState.SUCCEEDED)
        wait_until(lambda: runs.count() >= 2, timing.FEW_SECONDS_OF_RUNS)
    finally:
        running.close()
    for run in runs:
        result = task_backends["default"].get_result(str(run.pk))
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42
        assert result.args == [40] and result.kwargs == {"b": 2}
        assert result.task.func is task_defs.add.func
    keys = list(JobRun.objects.filter(job__name=NAME).values_list("key", flat=True))
    assert len(keys) == len(set(keys))


def test_schedule_validates_its_arguments_and_options():
    with pytest.raises(InvalidPayload):
        schedule(task_defs.add, cron="0 3 * * *", args=[object()], name="tests.bad_args")
    with pytest.raises(ImproperlyDeclared, match="cron"):
        schedule(task_defs.add, cron="every day", name="tests.bad_cron")
    with pytest.raises(TypeError, match="ClusterJobsBackend"):
        schedule(task_defs.add.func, cron="0 3 * * *")

"""Real runscheduler processes on one database: count rows, not log lines."""

from __future__ import annotations

import itertools
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs.models import JobDefinition, JobRun, NodeStatus, RunState, WorkerNode
from tests.conftest import wait_until
from tests.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

ALL = "every_second,per_node,startup,rate,delay"


def seconds(job: str) -> list:
    return sorted(JobRun.objects.filter(job__name=job).values_list("scheduled_at", flat=True))


def ledger_of(job: str) -> str:
    """The job's rows, for failure messages."""
    fields = ("key", "state", "outcome", "node", "reason")
    runs = JobRun.objects.filter(job__name=job).order_by("scheduled_at").values_list(*fields)
    return "\n".join(" ".join(map(str, run)) for run in runs)


def assert_contiguous(instants: list, step: timedelta) -> None:
    gaps = [(a, b) for a, b in itertools.pairwise(instants) if b - a != step]
    assert not gaps, f"missed or doubled occurrences between {gaps}"


def test_three_nodes_run_each_occurrence_exactly_once(start_scheduler):
    nodes = [start_scheduler(f"n{i}", "--duration", "10", jobs=ALL) for i in range(3)]
    for node in nodes:
        assert node.wait(timeout=45) == 0, node.output()

    every = seconds("tests.every_second")
    assert len(every) >= 7
    assert_contiguous(every, timedelta(seconds=1))
    effects = Effect.objects.filter(job="tests.every_second")
    ledger = ledger_of("tests.every_second") + "\n" + "\n".join(n.output() for n in nodes)
    assert effects.count() == len(every) == len(set(effects.values_list("key", flat=True))), ledger
    assert set(JobRun.objects.values_list("state", flat=True)) == {RunState.SUCCEEDED}, ledger
    assert (
        len(
            set(
                JobRun.objects.filter(job__name="tests.every_second").values_list("node", flat=True)
            )
        )
        >= 2
    ), "one node won everything"

    assert_contiguous(seconds("tests.rate"), timedelta(seconds=2))
    for node in nodes:
        per_node = seconds_on(node.node_id)
        assert len(per_node) >= 5
        assert_contiguous(per_node, timedelta(seconds=1))
        assert Effect.objects.filter(job="tests.startup", node=node.node_id).count() == 1
    assert_fixed_delay_windows("tests.delay", timedelta(seconds=2))
    assert set(WorkerNode.objects.values_list("status", flat=True)) == {NodeStatus.STOPPED}


def seconds_on(node_id: str) -> list:
    runs = JobRun.objects.filter(job__name="tests.per_node", node=node_id)
    assert all(key.endswith(f"@{node_id}") for key in runs.values_list("key", flat=True))
    return sorted(runs.values_list("scheduled_at", flat=True))


def assert_fixed_delay_windows(job: str, delay: timedelta) -> None:
    runs = list(JobRun.objects.filter(job__name=job).order_by("started_at"))
    assert len(runs) >= 2
    for previous, following in itertools.pairwise(runs):
        # Cluster time comes from one database clock; allow its measurement error.
        assert following.started_at >= previous.finished_at + delay - timedelta(milliseconds=50)


def test_sigterm_lets_running_jobs_finish_and_exits_zero(start_scheduler):
    node = start_scheduler("slow", jobs="slow", CLUSTER_JOBS_TEST_SLOW="3")
    wait_until(lambda: Effect.objects.filter(job="tests.slow").exists(), timeout=30)
    signalled = timezone.now()
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=20) == 0, node.output()
    runs = JobRun.objects.filter(job__name="tests.slow")
    assert runs.exists()
    for run in runs:
        assert run.state == RunState.SUCCEEDED, node.output()
        assert Effect.objects.filter(key=run.key).count() == 2, "a handler was cut short"
    assert not runs.filter(created_at__gt=signalled + timedelta(seconds=1)).exists()
    assert WorkerNode.objects.get(node_id="slow").status == NodeStatus.STOPPED


def test_disabling_a_job_stops_it_on_a_running_node(start_scheduler):
    node = start_scheduler("toggle", "--duration", "25", jobs="every_second")
    wait_until(lambda: JobRun.objects.filter(job__name="tests.every_second").count() >= 2, 30)
    definition = JobDefinition.objects.get(name="tests.every_second")
    definition.enabled = False
    definition.save()  # what the admin does
    disabled_at = timezone.now()
    time.sleep(2.5)  # bounded observation window: nothing may fire during it
    late = JobRun.objects.filter(
        job__name="tests.every_second", created_at__gt=disabled_at + timedelta(milliseconds=300)
    )
    assert not late.exists(), node.output()
    wait_until(lambda: WorkerNode.objects.get(node_id="toggle").skipped.get("disabled"), 10)
    definition.enabled = True
    definition.save()
    enabled_at = timezone.now()
    wait_until(
        lambda: JobRun.objects.filter(
            job__name="tests.every_second", created_at__gt=enabled_at
        ).exists(),
        10,
    )
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=20) == 0

"""Overlap, concurrency, tags and cancellation across real scheduler processes."""

from __future__ import annotations

import pytest

from django_cluster_jobs import services
from django_cluster_jobs.models import EventKind, JobRun, RunEvent, RunState, WorkerNode
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]


def run_cluster(start_scheduler, jobs: str, nodes: int = 2, seconds: int = 9) -> None:
    procs = [start_scheduler(f"n{i}", "--duration", str(seconds), jobs=jobs) for i in range(nodes)]
    for proc in procs:
        assert proc.wait(timeout=60) == 0, proc.output()


def executed(job: str) -> list[JobRun]:
    return list(
        JobRun.objects.filter(
            job__name=job, started_at__isnull=False, finished_at__isnull=False
        ).order_by("started_at")
    )


def most_at_once(runs: list[JobRun]) -> int:
    """The largest number of runs whose [started_at, finished_at) intervals overlap."""
    edges = sorted([(r.started_at, 1) for r in runs] + [(r.finished_at, -1) for r in runs])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def skipped(job: str, reason: str) -> int:
    return JobRun.objects.filter(
        job__name=job, state=RunState.SKIPPED, reason__contains=reason
    ).count()


def test_overlap_skip_never_runs_two_at_once_and_records_the_skips(start_scheduler):
    run_cluster(start_scheduler, "overlap_skip")
    runs = executed("tests.overlap_skip")
    assert len(runs) >= 2 and most_at_once(runs) == 1
    assert skipped("tests.overlap_skip", "still live") >= 3
    assert all(r.state == RunState.SUCCEEDED for r in runs)


def test_overlap_allow_runs_them_side_by_side(start_scheduler):
    run_cluster(start_scheduler, "overlap_allow")
    assert most_at_once(executed("tests.overlap_allow")) >= 2
    assert skipped("tests.overlap_allow", "") == 0


def test_buffer_one_runs_right_after_the_current_one(start_scheduler):
    run_cluster(start_scheduler, "overlap_buffer")
    runs = executed("tests.overlap_buffer")
    assert len(runs) >= 2 and most_at_once(runs) == 1
    buffered = [r for r in runs if r.reason.startswith("buffered")]
    assert buffered, "no occurrence was buffered"
    for run in buffered:
        previous = max(
            (r for r in runs if r.finished_at <= run.started_at), key=lambda r: r.finished_at
        )
        assert (run.started_at - previous.finished_at).total_seconds() < 1.5
    assert skipped("tests.overlap_buffer", "already buffered") >= 1


def test_cancel_other_cancels_the_running_one(start_scheduler):
    run_cluster(start_scheduler, "overlap_cancel")
    runs = executed("tests.overlap_cancel")
    cancelled = [r for r in runs if r.state == RunState.CANCELLED]
    assert len(cancelled) >= 3
    for run in cancelled:
        assert run.events.filter(kind=EventKind.CANCEL_REQUESTED).exists()


def test_max_concurrency_holds_under_contention_from_three_nodes(start_scheduler):
    run_cluster(start_scheduler, "concurrent", nodes=3, seconds=10)
    runs = executed("tests.concurrent")
    assert most_at_once(runs) == 2
    assert skipped("tests.concurrent", "max_concurrency 2 reached") >= 2
    keys = list(JobRun.objects.filter(job__name="tests.concurrent").values_list("key", flat=True))
    assert len(keys) == len(set(keys))


def test_only_nodes_with_the_required_tags_run_the_job(start_scheduler):
    tagged = start_scheduler("g", "--duration", "6", "--tags", "gpu,ssd", jobs="gpu")
    plain = start_scheduler("c", "--duration", "6", jobs="gpu")
    for proc in (tagged, plain):
        assert proc.wait(timeout=40) == 0, proc.output()
    runs = JobRun.objects.filter(job__name="tests.gpu")
    assert set(runs.exclude(state=RunState.SKIPPED).values_list("node", flat=True)) == {"g"}
    # A skipped row (a run that outlived its second) names no node; its timeline names who decided.
    events = RunEvent.objects.filter(run__job__name="tests.gpu")
    assert set(events.values_list("node", flat=True)) == {"g"}
    assert WorkerNode.objects.get(node_id="g").tags == ["gpu", "ssd"]


def test_a_cancel_request_reaches_its_node_at_the_next_heartbeat(start_scheduler):
    node = start_scheduler("n1", "--duration", "25")
    wait_until(lambda: WorkerNode.objects.filter(status="active").exists(), 30)
    run = services.enqueue("tests.cancellable")
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.RUNNING, 20)
    assert services.request_cancel(JobRun.objects.get(pk=run.pk), by="operator")
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.CANCELLED, 5)
    assert JobRun.objects.get(pk=run.pk).result == "cancelled"
    node.signal(15)
    assert node.wait(timeout=20) == 0


def test_a_queue_limit_holds_across_jobs_and_three_nodes(start_scheduler):
    run_cluster(start_scheduler, "queue_a,queue_b", nodes=3, seconds=10)
    runs = executed("tests.queue_a") + executed("tests.queue_b")
    assert most_at_once(runs) == 2
    skips = JobRun.objects.filter(state=RunState.SKIPPED, reason__contains="queue 'limited'")
    assert skips.count() >= 2


def test_max_concurrency_holds_for_pending_runs_too(start_scheduler):
    nodes = [start_scheduler(f"n{i}", "--duration", "30") for i in range(3)]
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 3, 30)
    runs = [services.enqueue("tests.pair") for _ in range(6)]
    wait_until(
        lambda: (
            JobRun.objects.filter(pk__in=[r.pk for r in runs], state=RunState.SUCCEEDED).count()
            == 6
        ),
        40,
    )
    assert most_at_once(executed("tests.pair")) == 2
    for node in nodes:
        node.signal(15)
        assert node.wait(timeout=20) == 0

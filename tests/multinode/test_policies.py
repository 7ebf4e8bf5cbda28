"""Overlap, concurrency, tags and cancellation across real scheduler processes."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest

from django_cluster_jobs import services
from django_cluster_jobs.models import EventKind, JobRun, RunEvent, RunState, WorkerNode
from tests.conftest import wait_until
from tests.ledger_checks import ROUND_TRIP, cluster_time_error
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, NODE_START, REACT, RUN_ENDS, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

#: How long each node fires the per-second policy jobs: room for several of their 2.5 to 3.5 s
#: runs to meet the next occurrences.
CLUSTER_LIFE = scaled(9)
#: The same with three nodes contending.
THREE_NODE_LIFE = scaled(10)
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)


def run_cluster(start_scheduler, jobs: str, nodes: int = 2, life: float = CLUSTER_LIFE) -> None:
    procs = [start_scheduler(f"n{i}", "--duration", f"{life:g}", jobs=jobs) for i in range(nodes)]
    for proc in procs:
        assert proc.wait(timeout=NODE_START + life + NODE_EXIT) == 0, proc.output()


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
    exact = []
    for run in buffered:
        position = runs.index(run)
        assert position > 0, f"buffered run {run.key} ran first: it waited for nothing"
        previous = runs[position - 1]
        # Released when the run before it ended, not left for a later occurrence: the node that
        # ends a run releases the buffered one in its next statement, due at the very instant it
        # wrote as the end.
        released = run.due_at - previous.finished_at
        if released:
            assert_released_by_a_claim(previous, run, released)
        else:
            exact.append(run)
        # A hang guard only: a node takes the released run within REACT.
        assert run.started_at - run.due_at <= timedelta(seconds=REACT), (run.key, run.due_at)
    # A claim can come first only within the ending node's statement's round trip, and a run
    # of 2.5 s ends between two occurrences: if no buffered run was released by its
    # predecessor's node, the ending node does not release it.
    assert exact, f"no buffered run was released at its predecessor's end: {buffered}"
    assert skipped("tests.overlap_buffer", "already buffered") >= 1


def assert_released_by_a_claim(previous: JobRun, run: JobRun, released: timedelta) -> None:
    """Another node's claim found ``previous`` ended before its node released ``run``: the claim
    released it (and says so in its skip), at its own instant, which may differ from the end by
    the two nodes' cluster-time errors and that round trip."""
    why = (previous.key, run.key, released)
    assert skipped("tests.overlap_buffer", "the buffered run goes first"), why
    assert abs(released) <= 2 * cluster_time_error() + timedelta(seconds=ROUND_TRIP), why


def test_cancel_other_cancels_the_running_one(start_scheduler):
    run_cluster(start_scheduler, "overlap_cancel")
    runs = executed("tests.overlap_cancel")
    cancelled = [r for r in runs if r.state == RunState.CANCELLED]
    assert len(cancelled) >= 3
    for run in cancelled:
        assert run.events.filter(kind=EventKind.CANCEL_REQUESTED).exists()


def test_max_concurrency_holds_under_contention_from_three_nodes(start_scheduler):
    run_cluster(start_scheduler, "concurrent", nodes=3, life=THREE_NODE_LIFE)
    runs = executed("tests.concurrent")
    assert most_at_once(runs) == 2
    assert skipped("tests.concurrent", "max_concurrency 2 reached") >= 2
    keys = list(JobRun.objects.filter(job__name="tests.concurrent").values_list("key", flat=True))
    assert len(keys) == len(set(keys))


def test_only_nodes_with_the_required_tags_run_the_job(start_scheduler):
    # The tagged node starts first and stops last, so it fires every occurrence from the job's
    # creation on: none is left for the leader to settle, whichever node leads.
    tagged = start_scheduler("g", "--tags", "gpu,ssd", "--duration", f"{SERVES:g}", jobs="gpu")
    active = WorkerNode.objects.filter(status="active")
    wait_until(lambda: active.filter(node_id="g").exists(), NODE_START)
    plain = start_scheduler("c", "--duration", f"{SERVES:g}", jobs="gpu")
    wait_until(lambda: active.filter(node_id="c").exists(), NODE_START)
    runs = JobRun.objects.filter(job__name="tests.gpu")
    both = runs.count()
    wait_until(lambda: runs.count() >= both + 3, FEW_SECONDS_OF_RUNS)  # seen by both nodes
    for proc in (plain, tagged):
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout=NODE_EXIT) == 0, proc.output()
    assert set(runs.exclude(state=RunState.SKIPPED).values_list("node", flat=True)) == {"g"}
    # A skipped row (a run that outlived its second) names no node; its timeline names who decided.
    events = RunEvent.objects.filter(run__job__name="tests.gpu")
    assert set(events.values_list("node", flat=True)) == {"g"}
    assert WorkerNode.objects.get(node_id="g").tags == ["gpu", "ssd"]


def test_a_cancel_request_reaches_its_node_at_the_next_heartbeat(start_scheduler):
    node = start_scheduler("n1", "--duration", f"{SERVES:g}")
    wait_until(lambda: WorkerNode.objects.filter(status="active").exists(), NODE_START)
    run = services.enqueue("tests.cancellable")
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.RUNNING, REACT)
    assert services.request_cancel(JobRun.objects.get(pk=run.pk), by="operator")
    # The handler waits 20 s unless cancelled: "cancelled" can only come from the request.
    wait_until(lambda: JobRun.objects.get(pk=run.pk).state == RunState.CANCELLED, REACT)
    assert JobRun.objects.get(pk=run.pk).result == "cancelled"
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=NODE_EXIT) == 0


def test_a_queue_limit_holds_across_jobs_and_three_nodes(start_scheduler):
    run_cluster(start_scheduler, "queue_a,queue_b", nodes=3, life=THREE_NODE_LIFE)
    runs = executed("tests.queue_a") + executed("tests.queue_b")
    assert most_at_once(runs) == 2
    skips = JobRun.objects.filter(state=RunState.SKIPPED, reason__contains="queue 'limited'")
    assert skips.count() >= 2


def test_max_concurrency_holds_for_pending_runs_too(start_scheduler):
    nodes = [start_scheduler(f"n{i}", "--duration", f"{SERVES:g}") for i in range(3)]
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 3, NODE_START)
    runs = [services.enqueue("tests.pair") for _ in range(6)]
    done = JobRun.objects.filter(pk__in=[r.pk for r in runs], state=RunState.SUCCEEDED)
    # Three rounds of two 1.5 s runs, each round started by a node acting on the news.
    wait_until(lambda: done.count() == 6, RUN_ENDS + 3 * REACT)
    assert most_at_once(executed("tests.pair")) == 2
    for node in nodes:
        node.signal(signal.SIGTERM)
        assert node.wait(timeout=NODE_EXIT) == 0

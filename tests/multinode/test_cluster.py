"""Real runscheduler processes on one database: count rows, not log lines."""

from __future__ import annotations

import itertools
import signal
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs.models import (
    JobDefinition,
    JobRun,
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

ALL = "every_second,per_node,startup,rate,delay"
#: How long each of the three nodes fires the jobs: time for about ten per-second occurrences.
CLUSTER_LIFE = scaled(10)
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)
#: How far the test's clock and a node's cluster time (the database's clock as the node measured
#: it) may disagree.
CLOCK_ERROR = timedelta(seconds=scaled(0.3))
#: From the test's sending SIGTERM to the node's loop seeing it (the process must be scheduled
#: and finish the statement it is in), with the clocks' disagreement.
SIGNAL_TAKEN = timedelta(seconds=scaled(1))
#: The observation window after a disable: a healthy node fires nothing of the job in it.
OBSERVE = scaled(2.5)
#: What a skip of the overlap policy "skip" (the default) records: the previous run is live.
OVERLAP_SKIP = "overlap: the previous run is still live"


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


def assert_ran_or_skipped_once(job: str, ledger: str) -> None:
    """Each occurrence of ``job`` ran once and succeeded, or was skipped by the overlap policy
    (its previous run was still live on a slow machine) and ran nothing."""
    runs = JobRun.objects.filter(job__name=job)
    ran = runs.exclude(state=RunState.SKIPPED)
    assert set(ran.values_list("state", flat=True)) <= {RunState.SUCCEEDED}, ledger
    skips = runs.filter(state=RunState.SKIPPED).values_list("reason", flat=True)
    assert all(reason.startswith(OVERLAP_SKIP) for reason in skips), ledger
    per_key = Counter(Effect.objects.filter(job=job).values_list("key", flat=True))
    assert set(per_key.values()) <= {1}, f"an occurrence of {job} ran twice: {per_key}\n{ledger}"
    assert set(per_key) == set(ran.values_list("key", flat=True)), ledger


def test_three_nodes_run_each_occurrence_exactly_once(start_scheduler):
    nodes = [
        start_scheduler(f"n{i}", "--duration", f"{CLUSTER_LIFE:g}", jobs=ALL) for i in range(3)
    ]
    for node in nodes:
        assert node.wait(timeout=NODE_START + CLUSTER_LIFE + NODE_EXIT) == 0, node.output()

    every = seconds("tests.every_second")
    assert len(every) >= 7
    assert_contiguous(every, timedelta(seconds=1))
    ledger = ledger_of("tests.every_second") + "\n" + "\n".join(n.output() for n in nodes)
    for job in ALL.split(","):
        assert_ran_or_skipped_once(f"tests.{job}", ledger)
    for node in nodes:  # each node raced for the shared occurrences: it won some or lost some
        won = JobRun.objects.filter(job__name="tests.every_second", node=node.node_id).exists()
        lost = WorkerNode.objects.get(node_id=node.node_id).claims_lost
        assert won or lost, f"{node.node_id} never competed\n{ledger}"

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
    wait_until(lambda: Effect.objects.filter(job="tests.slow").exists(), NODE_START + REACT)
    signalled = timezone.now()
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=NODE_EXIT) == 0, node.output()
    runs = JobRun.objects.filter(job__name="tests.slow")
    ran = runs.exclude(state=RunState.SKIPPED)
    assert ran.exists()
    for run in ran:
        assert run.state == RunState.SUCCEEDED, node.output()
        assert Effect.objects.filter(key=run.key).count() == 2, "a handler was cut short"
    skips = runs.filter(state=RunState.SKIPPED).values_list("reason", flat=True)
    assert all(reason.startswith(OVERLAP_SKIP) for reason in skips), ledger_of("tests.slow")
    # The node claims nothing after the signal (an occurrence it reached while the first run
    # was live is a skipped row, decided before it).
    late = runs.filter(outcome=Outcome.WON, created_at__gt=signalled + SIGNAL_TAKEN)
    assert not late.exists(), ledger_of("tests.slow")
    assert WorkerNode.objects.get(node_id="slow").status == NodeStatus.STOPPED


def test_disabling_a_job_stops_it_on_a_running_node(start_scheduler):
    node = start_scheduler("toggle", "--duration", f"{SERVES:g}", jobs="every_second")
    every = JobRun.objects.filter(job__name="tests.every_second")
    wait_until(lambda: every.count() >= 2, FEW_SECONDS_OF_RUNS)
    definition = JobDefinition.objects.get(name="tests.every_second")
    definition.enabled = False
    definition.save()  # what the admin does
    disabled_at = timezone.now()
    # A claim after the change is refused in the claim's own statement (the job's mark and
    # revision moved with it), so nothing may fire during the window, however slow the node.
    timing.pause(OBSERVE)
    late = every.filter(created_at__gt=disabled_at + CLOCK_ERROR)
    assert not late.exists(), node.output()
    wait_until(lambda: WorkerNode.objects.get(node_id="toggle").skipped.get("disabled"), REACT)
    definition.enabled = True
    definition.save()
    enabled_at = timezone.now()
    wait_until(lambda: every.filter(created_at__gt=enabled_at).exists(), REACT)
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=NODE_EXIT) == 0

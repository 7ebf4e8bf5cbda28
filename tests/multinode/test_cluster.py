"""Real runscheduler processes on one database: count rows, not log lines."""

from __future__ import annotations

import itertools
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs import services
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
from tests.ledger_checks import assert_every_occurrence_once, cluster_time_error, ledger_of
from tests.models import Effect
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, NODE_START, REACT, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

ALL = "every_second,per_node,startup,rate,delay"
#: How long each of the three nodes fires the jobs: time for about ten per-second occurrences.
CLUSTER_LIFE = scaled(10)
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)
#: From the test's sending SIGTERM to the node's loop seeing it: the process must be scheduled
#: and finish the statement it is in.
SIGNAL_TAKEN = timedelta(seconds=scaled(1))
#: The observation window after a disable: a healthy node fires nothing of the job in it.
OBSERVE = scaled(2.5)
SECOND = timedelta(seconds=1)


def test_three_nodes_run_each_occurrence_exactly_once(start_scheduler):
    nodes = [
        start_scheduler(f"n{i}", "--duration", f"{CLUSTER_LIFE:g}", jobs=ALL) for i in range(3)
    ]
    for node in nodes:
        assert node.wait(timeout=NODE_START + CLUSTER_LIFE + NODE_EXIT) == 0, node.output()
    logs = "\n".join(n.output() for n in nodes)

    # Each node serves CLUSTER_LIFE seconds from its own start: the cluster serves ten seconds
    # at least, so seven occurrences at least fall in it.
    assert_every_occurrence_once("tests.every_second", step=SECOND, least=7, context=logs)
    for node in nodes:  # each node raced for the shared occurrences: it won some or lost some
        won = JobRun.objects.filter(job__name="tests.every_second", node=node.node_id).exists()
        lost = WorkerNode.objects.get(node_id=node.node_id).claims_lost
        assert won or lost, f"{node.node_id} never competed\n{ledger_of('tests.every_second')}"

    # Those seven seconds hold three slots at least of the fixed rate (anchored on the epoch).
    assert_every_occurrence_once("tests.rate", step=2 * SECOND, least=3, context=logs)
    for node in nodes:
        own = f"@{node.node_id}"
        # Every-node occurrences are the node's own keys; a row that ran nothing names no node.
        assert_every_occurrence_once(
            "tests.per_node", step=SECOND, key_suffix=own, least=5, context=logs
        )
        ran = JobRun.objects.filter(job__name="tests.per_node", key__endswith=own)
        ran = ran.exclude(state=RunState.SKIPPED)
        assert set(ran.values_list("node", flat=True)) == {node.node_id}, ledger_of(
            "tests.per_node"
        )
        started = assert_every_occurrence_once("tests.startup", key_suffix=own, context=logs)
        assert len(started) == 1, ledger_of("tests.startup")
    assert_every_occurrence_once("tests.delay", least=2, context=logs)
    assert_fixed_delay_windows("tests.delay", 2 * SECOND)
    assert set(WorkerNode.objects.values_list("status", flat=True)) == {NodeStatus.STOPPED}


def assert_fixed_delay_windows(job: str, delay: timedelta) -> None:
    runs = list(JobRun.objects.filter(job__name=job).order_by("started_at"))
    for previous, following in itertools.pairwise(runs):
        # Exact: the claim compared these very instants, under the job's lock (a run is claimed
        # only once the latest one's stored end plus the delay is at or before the claim's own
        # instant, which it stores as its start), so no clock can make them disagree.
        assert following.started_at >= previous.finished_at + delay, ledger_of(job)


def test_sigterm_lets_running_jobs_finish_and_exits_zero(start_scheduler):
    node = start_scheduler("slow", jobs="slow", CLUSTER_JOBS_TEST_SLOW="3")
    wait_until(lambda: Effect.objects.filter(job="tests.slow").exists(), NODE_START + REACT)
    signalled = services.cluster_now()  # before the signal, on the database's clock
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=NODE_EXIT) == 0, node.output()
    # A run of 3 s covers the next seconds' occurrences: they are skipped naming it, so only
    # one run need have run. Each run that ran recorded its start and its end: none was cut
    # short.
    assert_every_occurrence_once(
        "tests.slow", step=SECOND, least_ran=1, effects_per_run=2, context=node.output()
    )
    # The node claims nothing after the signal (an occurrence it reached while the first run
    # was live is a skipped row, decided before it).
    runs = JobRun.objects.filter(job__name="tests.slow")
    taken = signalled + SIGNAL_TAKEN + cluster_time_error()
    late = runs.filter(outcome=Outcome.WON, created_at__gt=taken)
    assert not late.exists(), ledger_of("tests.slow")
    assert WorkerNode.objects.get(node_id="slow").status == NodeStatus.STOPPED


def test_disabling_a_job_stops_it_on_a_running_node(start_scheduler):
    node = start_scheduler("toggle", "--duration", f"{SERVES:g}", jobs="every_second")
    every = JobRun.objects.filter(job__name="tests.every_second")
    wait_until(lambda: every.count() >= 2, FEW_SECONDS_OF_RUNS)
    definition = JobDefinition.objects.get(name="tests.every_second")
    definition.enabled = False
    definition.save()  # what the admin does
    disabled_at = services.cluster_now()  # after the change's commit, on the database's clock
    # A claim after the change's commit is refused in the claim's own statement (the job's mark
    # and revision moved with it), so nothing may fire during the window, however slow the
    # node: a claim that got in was made before the commit, at an instant of the node's cluster
    # time, off the database's clock by its error at most.
    timing.pause(OBSERVE)
    late = every.filter(created_at__gt=disabled_at + cluster_time_error())
    assert not late.exists(), node.output()
    wait_until(lambda: WorkerNode.objects.get(node_id="toggle").skipped.get("disabled"), REACT)
    definition.enabled = True
    definition.save()
    enabled_at = timezone.now()
    wait_until(lambda: every.filter(created_at__gt=enabled_at).exists(), REACT)
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=NODE_EXIT) == 0

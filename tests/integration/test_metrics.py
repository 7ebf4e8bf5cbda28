"""Prometheus metrics of a real node, scraped from its probe server after real runs."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import connections
from django.db.models import F
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_cluster_jobs import services
from django_cluster_jobs.engine import Node
from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    EventKind,
    JobDefinition,
    JobRun,
    RunEvent,
    RunState,
)
from django_cluster_jobs.observe import metrics
from django_cluster_jobs.observe.probes import ProbeServer
from django_cluster_jobs.status import backlog, dead_letters
from tests import timing
from tests.conftest import wait_until
from tests.factories import RunningRunFactory
from tests.timing import scaled

pytestmark = pytest.mark.django_db(transaction=True)

#: Quick heartbeats, leases and leader turns, on the suite's time scale.
FAST = {
    "HEARTBEAT_INTERVAL": scaled(0.2),
    "DEAD_AFTER": scaled(2.0),
    "LEASE_TTL": scaled(3.0),
    "LEADER_TTL": scaled(1.0),
    "GRACE_PERIOD": scaled(1.0),
    "CLOCK": None,
}
#: The node's probe server answers one GET (it reads memory only).
PROBE_ANSWERS = scaled(10)
FINISHED = (RunState.SUCCEEDED, RunState.FAILED, RunState.TIMED_OUT, RunState.DEAD)


def scrape(server: ProbeServer) -> dict[tuple[str, tuple], float]:
    """GET /metrics and parse it: {(sample name, sorted labels): value}."""
    url = f"http://127.0.0.1:{server.port}/metrics"
    with urllib.request.urlopen(url, timeout=PROBE_ANSWERS) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def node() -> Iterator[Node]:
    with override_settings(CLUSTER_JOBS=FAST):
        node = Node("measured", threads=3)
        recorder = metrics.for_node(node)
        assert recorder is not None
        server = ProbeServer(node.health, 0, host="127.0.0.1", metrics=recorder.exposition)
        server.start()
        node.probes = server

        def loop() -> None:
            try:
                node.run(duration=timing.PROCESS_LIFE)
            finally:
                connections.close_all()

        thread = node.loop_thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        wait_until(lambda: node.health.started().ok, timeout=timing.NODE_START)
        yield node
        node.request_stop(reason="test over")
        thread.join(timeout=timing.NODE_EXIT)
        server.stop()
        recorder.disconnect()
        assert not thread.is_alive()


def ended(job: str, n: int) -> bool:
    return JobRun.objects.filter(job__name=job, state__in=FINISHED).count() >= n


@pytest.mark.timing
def test_counters_and_histograms_match_the_ledger_after_real_runs(node):
    for value_ in range(3):
        services.enqueue("tests.manual", {"value": value_})
    services.enqueue("tests.boom")
    services.enqueue("tests.no_retry")  # never retried: dead-lettered at once
    services.enqueue("tests.hang")  # the process executor kills it at its deadline
    wait_until(lambda: ended("tests.manual", 3) and ended("tests.boom", 1)
               and ended("tests.no_retry", 1) and ended("tests.hang", 1),
               timeout=timing.REACT + timing.RUN_ENDS)  # fmt: skip
    wait_until(lambda: node.leader.held is not None, timeout=timing.REACT)
    samples = scrape(node.probes)
    acquired = ClusterEvent.objects.filter(
        kind=ClusterEventKind.LEADER_ACQUIRED, node=node.node_id
    ).count()

    def ledger(job: str, state: str) -> int:
        return JobRun.objects.filter(job__name=job, state=state, node=node.node_id).count()

    runs = "cluster_jobs_runs_total"
    assert value(samples, runs, job="tests.manual", queue="default", outcome="succeeded") == 3
    assert ledger("tests.manual", RunState.SUCCEEDED) == 3
    assert value(samples, runs, job="tests.boom", queue="default", outcome="failed") == 1
    assert ledger("tests.boom", RunState.FAILED) == 1
    assert value(samples, runs, job="tests.no_retry", queue="default", outcome="failed") == 1
    assert value(samples, "cluster_jobs_runs_dead_lettered_total", job="tests.no_retry",
                 queue="default") == ledger("tests.no_retry", RunState.DEAD) == 1  # fmt: skip
    assert value(samples, runs, job="tests.hang", queue="default", outcome="timed_out") == 1
    assert ledger("tests.hang", RunState.TIMED_OUT) == 1
    # One duration and one lag observation per run, in the node process (also the child's run).
    duration = "cluster_jobs_run_duration_seconds_count"
    assert value(samples, duration, job="tests.hang", queue="default", outcome="timed_out") == 1
    assert value(samples, duration, job="tests.manual", queue="default", outcome="succeeded") == 3
    lag = "cluster_jobs_firing_lag_seconds_count"
    assert value(samples, lag, job="tests.manual", queue="default") == 3
    # The leader's cluster-wide gauges, read from the ledger.
    assert value(samples, "cluster_jobs_leader", node=node.node_id) == 1
    assert value(samples, "cluster_jobs_dead_letters", job="tests.no_retry") == 1
    # Once, unless a stall on a loaded host cost the lease for a moment: as the ledger says.
    changes = "cluster_jobs_leadership_changes_total"
    assert value(samples, changes, change="acquired") == acquired >= 1
    assert ("cluster_jobs_heartbeat_age_seconds", (("node", node.node_id),)) in samples
    assert ("cluster_jobs_clock_offset_seconds", (("node", node.node_id),)) in samples


@pytest.mark.timing
def test_claims_are_counted_and_match_the_ledger(node):
    every_second = JobDefinition.objects.get(name="tests.every_second")
    every_second.enabled = True
    every_second.save()  # the node re-plans at its next heartbeat
    wait_until(lambda: node.counters.snapshot(0.0).claims_won >= 2,
               timeout=timing.FEW_SECONDS_OF_RUNS)  # fmt: skip
    node.request_stop(reason="count")
    node.loop_thread.join(timeout=timing.NODE_EXIT)
    samples = scrape(node.probes)  # the probe server outlives the loop here
    claimed = value(samples, "cluster_jobs_occurrences_claimed_total", node=node.node_id)
    won = JobRun.objects.filter(job__name="tests.every_second", node=node.node_id)
    assert claimed == won.exclude(state=RunState.SKIPPED).count() >= 2
    assert value(samples, "cluster_jobs_runs_total", job="tests.every_second", queue="default",
                 outcome="succeeded") == won.filter(state=RunState.SUCCEEDED).count()  # fmt: skip
    stats = node.counters.snapshot(0.0)
    for reason, n in stats.skipped.items():
        assert value(samples, "cluster_jobs_occurrences_skipped_total", node=node.node_id,
                     reason=reason) == n  # fmt: skip


@pytest.mark.timing
def test_a_takeover_of_a_run_whose_owner_went_away_is_counted(node):
    """A run left running by a node that is gone: the leader reaps its expired lease, this node
    runs the next attempt, and the takeover is counted once, by its cause."""
    wait_until(lambda: node.leader.held is not None, timeout=timing.REACT)
    job = JobDefinition.objects.get(name="tests.manual")
    past = timezone.now() - timedelta(seconds=5)
    orphan = RunningRunFactory(job=job, node="gone", lease_expires_at=past, payload={"value": 1})
    # The leader reaps it at a chore, then this node takes the next attempt and runs it.
    wait_until(lambda: ended("tests.manual", 1), timeout=timing.REACT + timing.RUN_ENDS)
    orphan.refresh_from_db()
    assert (orphan.state, orphan.attempt, orphan.node) == (RunState.SUCCEEDED, 2, node.node_id)
    assert orphan.events.filter(kind=EventKind.TAKEN_OVER).count() == 1
    samples = scrape(node.probes)
    assert value(samples, "cluster_jobs_lease_takeovers_total", job="tests.manual",
                 cause="lease_expired") == 1  # fmt: skip


@pytest.mark.timing
def test_a_fenced_out_write_back_is_counted(node):
    """The run is taken from this node while its handler runs (its fence moves on): the end it
    then writes is refused and counted, on every database (PostgreSQL writes that row in SQL).

    The handler waits until it is cancelled, which the heartbeat does once it sees the run
    taken over: it cannot end before the takeover, however slow the host."""
    services.enqueue("tests.cancellable")
    run = wait_until(lambda: JobRun.objects.filter(job__name="tests.cancellable",
                                                   state="running").first(),
                     timeout=timing.REACT)  # fmt: skip
    JobRun.objects.filter(pk=run.pk).update(fence=F("fence") + 1, node="elsewhere")
    wait_until(lambda: RunEvent.objects.filter(run_id=run.pk, kind=EventKind.FENCED_OUT).exists(),
               timeout=timing.REACT + timing.RUN_ENDS)  # fmt: skip
    wait_until(lambda: value(scrape(node.probes), "cluster_jobs_fenced_out_writes_total") == 1,
               timeout=timing.REACT)  # fmt: skip


def test_the_backlog_is_the_due_pending_runs_by_queue():
    services.enqueue("tests.manual")
    services.enqueue("tests.manual")
    now = JobRun.objects.get(pk=services.enqueue("tests.boom").pk).due_at
    queues = backlog("default", now)
    assert set(queues) == {"default"}
    assert queues["default"][0] == 3 and queues["default"][1] >= 0
    assert dead_letters("default") == {}


def test_without_prometheus_client_nothing_is_recorded(monkeypatch):
    monkeypatch.setattr(metrics, "prometheus_client", None)
    assert metrics.for_node(Node("unmeasured")) is None

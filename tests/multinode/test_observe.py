"""Real runscheduler processes with --probe-port: probes answer, metrics add up to the ledger."""

from __future__ import annotations

import json
import signal
import socket
import urllib.error
import urllib.request

import pytest
from opentelemetry import trace
from prometheus_client.parser import text_string_to_metric_families

from django_cluster_jobs import services
from django_cluster_jobs.models import JobDefinition, JobRun, Outcome, RunState
from tests.conftest import wait_until
from tests.spans import memory_exporter
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, NODE_START, REACT, RUN_ENDS, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)
#: A live node's probe server answers one request (a hang guard for urlopen).
PROBE_ANSWERS = scaled(5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}{path}", timeout=PROBE_ANSWERS
        ) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""  # not listening yet


def samples(port: int) -> dict[tuple[str, tuple], float]:
    status, text = get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(found: dict, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and wanted <= set(ls))


def test_two_nodes_serve_probes_and_metrics_that_match_the_ledger(start_scheduler):
    ports = {"m0": free_port(), "m1": free_port()}
    args = ("--duration", f"{SERVES:g}", "--probe-port")
    nodes = [
        start_scheduler(node_id, *args, str(port), jobs="every_second")
        for node_id, port in ports.items()
    ]
    for port in ports.values():
        wait_until(lambda port=port: get(port, "/startupz")[0] == 200, timeout=NODE_START)
        assert get(port, "/livez")[0] == 200
        status, body = get(port, "/readyz")
        assert status == 200, body
        assert json.loads(body)["checks"]["database"] is True
    every = JobRun.objects.filter(job__name="tests.every_second")
    wait_until(lambda: every.filter(state=RunState.SUCCEEDED).count() >= 4, FEW_SECONDS_OF_RUNS)
    # Stop the job, let what runs end, then every figure is final and must add up.
    job = JobDefinition.objects.get(name="tests.every_second")
    job.enabled = False
    job.save()
    wait_until(lambda: not every.filter(state__in=(RunState.PENDING, RunState.RUNNING))
               .exists(), timeout=RUN_ENDS)  # fmt: skip

    def scraped() -> list[dict]:
        return [samples(port) for port in ports.values()]

    def claims(found: list[dict]) -> float:
        return sum(total(f, "cluster_jobs_occurrences_claimed_total") for f in found)

    # What the nodes claimed: not the rows the disable itself records missed (an occurrence
    # due before it that no claim had reached), nor the overlap policy's skipped rows.
    claimed_rows = every.filter(outcome=Outcome.WON).exclude(state=RunState.SKIPPED)
    # Each node re-plans at its next heartbeat; then nothing more is claimed and the sums hold.
    wait_until(lambda: claims(scraped()) == claimed_rows.count(), timeout=REACT)
    found = scraped()
    claimed = claimed_rows.count()
    assert sum(total(f, "cluster_jobs_occurrences_claimed_total") for f in found) == claimed
    succeeded = sum(total(f, "cluster_jobs_runs_total", job="tests.every_second",
                          outcome="succeeded") for f in found)  # fmt: skip
    assert succeeded == every.filter(state=RunState.SUCCEEDED).count() >= 4
    assert sum(total(f, "cluster_jobs_leader") for f in found) == 1  # one leader
    for node in nodes:
        node.signal(signal.SIGTERM)
        assert node.wait(timeout=NODE_EXIT) == 0, node.output()


def test_one_trace_from_enqueue_to_the_run_on_another_process(start_scheduler, tmp_path):
    memory_exporter()  # this process's provider, so the request span is a real one
    with trace.get_tracer("app").start_as_current_span("request") as request:
        run = services.enqueue("tests.manual", {"value": 3})
    spans = tmp_path / "spans.jsonl"
    node = start_scheduler("t0", "--duration", f"{SERVES:g}", CLUSTER_JOBS_TEST_SPANS=str(spans))
    done = JobRun.objects.filter(pk=run.pk, state=RunState.SUCCEEDED)
    wait_until(done.exists, timeout=NODE_START + REACT)  # it starts, then takes what is pending
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=NODE_EXIT) == 0, node.output()
    exported = [json.loads(line) for line in spans.read_text().splitlines() if line.strip()]
    (span,) = [s for s in exported if s["name"] == "tests.manual run"]
    context = request.get_span_context()
    assert span["context"]["trace_id"] == f"0x{context.trace_id:032x}"
    assert span["parent_id"] == f"0x{context.span_id:016x}"
    assert span["attributes"]["cluster_jobs.run_id"] == run.pk
    assert span["attributes"]["cluster_jobs.node"] == "t0"

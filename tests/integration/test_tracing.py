"""OpenTelemetry: one trace from the code that enqueued a run to the run's span on the node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_cluster_jobs import services
from django_cluster_jobs.engine import Node
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from django_cluster_jobs.observe import tracing
from tests import timing
from tests.conftest import wait_until
from tests.nodes import served
from tests.spans import memory_exporter
from tests.timing import scaled

pytestmark = pytest.mark.django_db(transaction=True)

#: Quick heartbeats and leases, on the suite's time scale.
FAST = {
    "HEARTBEAT_INTERVAL": scaled(0.2),
    "LEASE_TTL": scaled(3.0),
    "DEAD_AFTER": scaled(2.0),
    "CLOCK": None,
}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = memory_exporter()
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
def node(spans) -> Iterator[Node]:
    with override_settings(CLUSTER_JOBS=FAST):
        node = Node("traced", threads=2)
        node.start()
        yield node
        node.stop()


def run_spans(exporter: InMemorySpanExporter, job: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == f"{job} run"]


def test_enqueue_stores_the_callers_trace_context(spans):
    with trace.get_tracer("app").start_as_current_span("request") as request:
        run = services.enqueue("tests.manual", {"value": 1})
    stored = JobRun.objects.get(pk=run.pk).trace_context
    context = request.get_span_context()
    assert stored["traceparent"].startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")


def test_enqueue_outside_a_trace_stores_nothing(spans):
    assert JobRun.objects.get(pk=services.enqueue("tests.manual").pk).trace_context is None


@pytest.mark.timing
def test_the_run_continues_the_trace_that_enqueued_it(node, spans):
    with trace.get_tracer("app").start_as_current_span("request") as request:
        run = services.enqueue("tests.manual", {"value": 2})
    served(node, run)  # looks until the run ended (one look may find it not yet due)
    # Its span ends on the executor's thread after the run's end is written.
    assert node.executor.wait_idle(timing.RUN_ENDS)
    (span,) = run_spans(spans, "tests.manual")
    assert span.context.trace_id == request.get_span_context().trace_id
    assert span.parent.span_id == request.get_span_context().span_id
    assert span.kind == SpanKind.CONSUMER
    attributes = dict(span.attributes)
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "default"
    assert attributes["faas.trigger"] == "other"
    assert attributes["cluster_jobs.run_id"] == run.pk
    assert attributes["cluster_jobs.job"] == "tests.manual"
    assert attributes["cluster_jobs.attempt"] == 1
    assert attributes["cluster_jobs.node"] == "traced"
    assert attributes["cluster_jobs.state"] == RunState.SUCCEEDED
    claims = [s for s in spans.get_finished_spans() if s.name == "cluster_jobs claim"]
    assert claims and claims[0].attributes["messaging.operation.type"] == "receive"


@pytest.mark.timing
def test_a_failed_run_has_an_error_status(node, spans):
    served(node, services.enqueue("tests.boom"))
    assert node.executor.wait_idle(timing.RUN_ENDS)  # its span ends after the run's end
    (span,) = run_spans(spans, "tests.boom")
    assert span.status.status_code == StatusCode.ERROR
    assert span.parent is None  # enqueued outside any trace: a trace of its own


@pytest.mark.timing
def test_a_scheduled_run_is_a_timer_with_its_cron(node, spans):
    definition = JobDefinition.objects.get(name="tests.every_second")
    definition.enabled = True
    definition.save()
    node.reload()
    # Ticks until the next second falls and its run ends.
    wait_until(lambda: (node.tick(), run_spans(spans, "tests.every_second"))[1],
               timeout=timing.RUN_ENDS)  # fmt: skip
    span = run_spans(spans, "tests.every_second")[0]
    assert span.attributes["faas.trigger"] == "timer"
    assert span.attributes["faas.cron"] == "* * * * * *"
    assert "faas.time" in span.attributes


def test_without_opentelemetry_nothing_is_traced(monkeypatch):
    monkeypatch.setattr(tracing, "trace", None)
    assert tracing.carrier() == {}
    assert JobRun.objects.get(pk=services.enqueue("tests.manual").pk).trace_context is None

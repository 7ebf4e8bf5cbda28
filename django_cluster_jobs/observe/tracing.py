"""OpenTelemetry traces, with the ``otel`` extra: a span per claim batch and per run.

``enqueue()`` stores the caller's W3C trace context with the run (:func:`carrier`); the node
that runs it continues that trace, so the request that enqueued work and the run that did it are
one trace. Without ``opentelemetry-api`` installed, or with the API but no tracer provider set
(no SDK configured), the node makes no span at all; ``enqueue()`` stores a context only when
there is one to continue.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from ..models import JobRun, Outcome, RunState, ScheduleKind

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the extra is not installed
    trace = None  # type: ignore[assignment]

TRACER = "django_cluster_jobs"
SYSTEM = "django_cluster_jobs"
#: Outcomes of runs that a schedule fired (a timer), rather than code or an operator.
TIMER_OUTCOMES = {Outcome.WON, Outcome.EVERY_NODE, Outcome.CATCH_UP}
FAILED = {RunState.FAILED, RunState.TIMED_OUT, RunState.DEAD, RunState.LOST}


def available() -> bool:
    return trace is not None


def recording() -> bool:
    """Whether spans are recorded: the API is installed and a tracer provider (an SDK) was set.
    Without one every span is a no-op, so the node neither reads a run's stored context nor
    builds spans (a read per run cost about 3 ms of firing lag, bench/firing_lag.py)."""
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def carrier() -> dict[str, str]:
    """The W3C trace context of the caller's current span, to store with a run; {} without."""
    if trace is None:
        return {}
    found: dict[str, str] = {}
    propagate.inject(found)
    return found


@contextmanager
def claim_span(node_id: str, counters: Any) -> Iterator[None]:
    """A span around one claim batch, counting the occurrences it won."""
    if not recording():
        yield
        return
    before = counters.snapshot(0.0).claims_won
    with trace.get_tracer(TRACER).start_as_current_span("cluster_jobs claim") as span:
        span.set_attribute("messaging.system", SYSTEM)
        span.set_attribute("messaging.operation.type", "receive")
        span.set_attribute("cluster_jobs.node", node_id)
        yield
        won = counters.snapshot(0.0).claims_won - before
        span.set_attribute("messaging.batch.message_count", won)


@contextmanager
def run_span(
    alias: str, won: Any, planned: Any, scheduled_at: datetime, node_id: str
) -> Iterator[Any]:
    """A span around one run, a child of the trace that enqueued it (if any); yields the span
    (None without a recording tracer) for :func:`record_outcome`."""
    if not recording():
        yield None
        return
    stored = JobRun.objects.using(alias).filter(pk=won.run_id)
    row = stored.values_list("trace_context", "outcome").first() or ({}, "")
    parent = propagate.extract(row[0] or {})
    definition = planned.definition
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(f"{planned.name} run", context=parent,
                                      kind=SpanKind.CONSUMER) as span:  # fmt: skip
        attributes = _attributes(won, planned, scheduled_at, row[1])
        for name, value in {**attributes, "cluster_jobs.node": node_id}.items():
            span.set_attribute(name, value)
        if definition.schedule_kind == ScheduleKind.CRON:
            span.set_attribute("faas.cron", definition.cron)
        yield span


def _attributes(won: Any, planned: Any, scheduled_at: datetime, outcome: str) -> dict[str, Any]:
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.destination.name": planned.definition.queue,
        "faas.trigger": "timer" if outcome in TIMER_OUTCOMES else "other",
        "cluster_jobs.job": planned.name,
        "cluster_jobs.occurrence": won.key,
        "cluster_jobs.run_id": won.run_id,
        "cluster_jobs.attempt": won.attempt,
        "faas.time": scheduled_at.isoformat(),
    }
    return attributes


def trace_id(span: Any) -> str:
    """The trace id of ``span`` in hex, as W3C writes it; "" without a span."""
    if span is None:
        return ""
    return format(span.get_span_context().trace_id, "032x")


def record_outcome(span: Any, state: str, error: str) -> None:
    """Mark the run's span with how the run ended."""
    if span is None:
        return
    span.set_attribute("cluster_jobs.state", str(state))
    if state in FAILED:
        span.set_status(Status(StatusCode.ERROR, error.split("\n", 1)[0][:200]))

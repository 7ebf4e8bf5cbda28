"""A tracer provider for scheduler subprocesses: each finished span, as one JSON line, to a file.

tests/settings.py installs it when CLUSTER_JOBS_TEST_SPANS names the file, so a multi-node test
can read the spans of a real runscheduler process after it exited.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def export_to(path: str) -> None:
    """Send every span of this process to ``path``, one JSON object per line."""
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's lifetime)
    exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


_memory = None


def memory_exporter():
    """The in-memory exporter of this (test) process's one tracer provider, installed once:
    OpenTelemetry lets a process set its provider only once."""
    global _memory
    if _memory is None:
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        _memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_memory))
        trace.set_tracer_provider(provider)
    return _memory

"""Per-run logs: what a handler logs through ctx.logger is stored with its run, bounded and
stamped, written under the run's fence, purged with it, and never able to fail the run."""

from __future__ import annotations

import logging
import re
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connections
from django.test import override_settings
from django.urls import reverse

from django_cluster_jobs import services
from django_cluster_jobs.coordination import Won
from django_cluster_jobs.engine.planner import load_planned
from django_cluster_jobs.engine.registration import sync_definitions
from django_cluster_jobs.engine.runner import Runner
from django_cluster_jobs.ledger import get_ledger
from django_cluster_jobs.models import EventKind, JobDefinition, JobRun, RunLog, RunState
from django_cluster_jobs.registry import registry
from tests import timing
from tests.clocks import FixedClock
from tests.conftest import wait_until
from tests.spans import memory_exporter

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR
#: What tests.chatty stores at the default level with lines=0, as (level, first line).
CHAT = [(INFO, "attempt 1 starts"), (ERROR, "caught it"), (WARNING, "done")]


@pytest.fixture
def env():
    sync_definitions(registry, "default")
    clock = FixedClock(T0)
    return Runner(get_ledger(), clock, "n1"), clock, load_planned("default", registry)


def run(env, name: str, **payload) -> JobRun:
    """Enqueue ``name`` and run its due attempts in this thread; return the run."""
    runner, clock, planned = env
    p = planned[name]
    first = services.enqueue(name, payload, at=T0)
    while taken := runner.ledger.vendor.take_pending(
        "n1", [p.definition.pk], 1, clock.now(), clock.now() + timedelta(seconds=30)
    ):
        runner.run(taken[0], p, taken[0].scheduled_at, taken[0].payload)
    return JobRun.objects.get(pk=first.pk)


def stored(job_run: JobRun) -> list[tuple[int, str]]:
    return [(line.level, line.message.split("\n")[0]) for line in job_run.logs.all()]


def test_lines_are_stored_with_their_run_stamped_with_time_level_node_and_attempt(env):
    done = run(env, "tests.chatty", lines=2)
    assert done.state == RunState.SUCCEEDED
    assert stored(done) == [CHAT[0], (INFO, "line 0"), (INFO, "line 1"), *CHAT[1:]]
    lines = list(done.logs.all())
    assert {(line.at, line.node, line.attempt) for line in lines} == {(T0, "n1", 1)}
    caught = lines[3].message
    assert "Traceback (most recent call last)" in caught and "KeyError: 'missing'" in caught
    assert lines[3].level_name == "ERROR"


def test_each_attempt_stamps_its_own_lines(env):
    done = run(env, "tests.chatty", fail_first=True)
    assert (done.state, done.attempt) == (RunState.SUCCEEDED, 2)
    attempts = [line.attempt for line in done.logs.all()]
    assert attempts == [1, 1, 1, 2, 2, 2]
    assert done.logs.filter(attempt=2).first().message == "attempt 2 starts"


@override_settings(CLUSTER_JOBS={"RUN_LOG_MAX_LINES": 3})
def test_lines_past_the_bound_are_dropped_and_one_marker_says_how_many(env):
    done = run(env, "tests.chatty", lines=5)
    lines = list(done.logs.all())
    assert [line.message for line in lines[:3]] == ["attempt 1 starts", "line 0", "line 1"]
    assert len(lines) == 4  # "line 2" … "line 4", the exception and "done" are dropped
    marker = lines[3]
    assert marker.level == WARNING
    assert marker.message.startswith("[5 more log lines (")
    assert "bound of 3 lines" in marker.message and "RUN_LOG_MAX_LINES" in marker.message


@override_settings(CLUSTER_JOBS={"RUN_LOG_MAX_BYTES": 30})
def test_the_byte_bound_holds_too(env):
    done = run(env, "tests.chatty", lines=5)
    lines = list(done.logs.all())
    kept = sum(len(line.message.encode()) for line in lines[:-1])
    assert kept <= 30
    assert [line.message for line in lines[:-1]] == ["attempt 1 starts", "line 0", "line 1"]
    assert lines[-1].message.startswith("[5 more log lines (")


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("WARNING", CHAT[1:]),
        ("debug", [(logging.DEBUG, "not stored at the default level"), *CHAT]),
        (logging.ERROR, CHAT[1:2]),
        (None, []),
    ],
)
def test_the_level_setting_chooses_what_is_stored(env, level, expected):
    with override_settings(CLUSTER_JOBS={"RUN_LOG_LEVEL": level}):
        done = run(env, "tests.chatty")
    assert done.state == RunState.SUCCEEDED
    assert stored(done) == expected


def test_an_async_handler_logs_the_same(env):
    done = run(env, "tests.chatty_async", lines=1)
    assert (done.state, done.result) == (RunState.SUCCEEDED, "chatted")
    assert stored(done) == [CHAT[0], (INFO, "line 0"), *CHAT[1:]]


def test_a_process_executor_child_logs_the_same(env):
    done = run(env, "tests.chatty_process", lines=1)
    assert (done.state, done.result) == (RunState.SUCCEEDED, "chatted")
    assert stored(done) == [CHAT[0], (INFO, "line 0"), *CHAT[1:]]
    assert "KeyError: 'missing'" in done.logs.get(level=ERROR).message


@pytest.mark.timing
def test_a_killed_child_keeps_what_it_logged_before(env):
    runner, clock, planned = env
    p = planned["tests.chatty_process"]
    job_run = services.enqueue("tests.chatty_process", {"hang": True}, at=T0)
    [won] = runner.ledger.vendor.take_pending(
        "n1", [p.definition.pk], 1, clock.now(), clock.now() + timedelta(seconds=30)
    )
    worker = threading.Thread(target=run_then_close, args=(runner, won, p))
    worker.start()
    try:
        # the child is a fresh interpreter that sets Django up, as a starting node does
        wait_until(lambda: runner.snapshot() and len(logged(runner)) == 3, timing.NODE_START)
        runner.cancel()  # the node kills the child, as at a timeout or a shutdown
    finally:
        worker.join(timeout=timing.REACT)
    assert not worker.is_alive()
    done = JobRun.objects.get(pk=job_run.pk)
    assert done.state == RunState.CANCELLED
    assert stored(done) == CHAT


def logged(runner: Runner) -> list:
    """The lines the one running attempt kept so far (in the node's memory)."""
    [active] = runner.snapshot()
    return active.context.logger.buffer.lines


def run_then_close(runner: Runner, won, p) -> None:
    try:
        runner.run(won, p, won.scheduled_at, won.payload)
    finally:
        connections.close_all()


def test_a_failing_log_write_does_not_fail_the_run_and_is_recorded(env, monkeypatch, caplog):
    runner = env[0]

    def broken(*args, **kwargs):
        raise OperationalError("disk I/O error")

    monkeypatch.setattr(runner.ledger.runs, "store_log", broken)
    done = run(env, "tests.chatty")
    assert (done.state, done.result) == (RunState.SUCCEEDED, "chatted")
    assert not done.logs.exists()
    lost = done.events.get(kind=EventKind.LOG_LOST)
    assert lost.reason == "3 log lines of attempt 1 not stored: OperationalError: disk I/O error"
    assert any("not stored" in r.getMessage() for r in caplog.records)


def test_a_stale_fence_stores_nothing(env):
    runner, _, planned = env
    job_run = services.enqueue("tests.chatty", at=T0)
    JobRun.objects.filter(pk=job_run.pk).update(state=RunState.RUNNING, fence=5, node="n2")
    stale = Won(job_run.pk, planned["tests.chatty"].definition.pk, job_run.key, 4, 1)
    assert runner.ledger.runs.store_log(stale, "n1", [(T0, INFO, "zombie")], "") is False
    held = Won(job_run.pk, stale.job_id, job_run.key, 5, 1)
    assert runner.ledger.runs.store_log(held, "n2", [(T0, INFO, "owner")], "") is True
    assert list(RunLog.objects.values_list("message", "node")) == [("owner", "n2")]


def test_the_run_span_trace_id_is_stamped_on_each_line(env):
    exporter = memory_exporter()
    exporter.clear()
    done = run(env, "tests.chatty")
    [span] = [s for s in exporter.get_finished_spans() if s.name == "tests.chatty run"]
    expected = format(span.context.trace_id, "032x")
    assert {line.trace_id for line in done.logs.all()} == {expected}
    assert len(expected) == 32 and expected != "0" * 32
    exporter.clear()


def test_retention_purges_the_lines_with_their_run(env):
    runner = env[0]
    done = run(env, "tests.chatty")
    kept = run(env, "tests.chatty_async")
    month_ago = T0 - timedelta(days=30)
    JobRun.objects.filter(pk=done.pk).update(finished_at=month_ago, scheduled_at=month_ago)
    JobDefinition.objects.filter(name="tests.chatty").update(settled_through=T0)
    assert done.logs.exists()
    assert runner.ledger.chores.purge(T0, timedelta(days=14)) == 1
    assert not JobRun.objects.filter(pk=done.pk).exists()
    assert not RunLog.objects.filter(run_id=done.pk).exists()
    assert RunLog.objects.filter(run_id=kept.pk).count() == 3


def test_the_runs_admin_page_shows_its_log_next_to_the_timeline(env, admin_client):
    done = run(env, "tests.chatty", lines=1)
    page = admin_client.get(reverse("admin:cluster_jobs_jobrun_change", args=[done.pk]))
    html = page.content.decode()
    assert page.status_code == 200
    headings = re.findall(r'<h2 id="(\w+)-heading" class="inline-heading">\s*(.*?)\s*</h2>', html)
    assert [title for _, title in headings] == ["Run events", "Log"]
    assert "<pre>line 0</pre>" in html and "<pre>caught it\nTraceback" in html
    assert "KeyError: &#x27;missing&#x27;" in html and "WARNING" in html


def test_the_api_shows_the_stored_lines(env, viewer):
    done = run(env, "tests.chatty")
    body = viewer.get(reverse("cluster_jobs_api:run-detail", args=[done.pk])).json()
    assert [(line["level"], line["message"].split("\n")[0]) for line in body["logs"]] == [
        ("INFO", "attempt 1 starts"),
        ("ERROR", "caught it"),
        ("WARNING", "done"),
    ]
    assert {(line["attempt"], line["node"]) for line in body["logs"]} == {(1, "n1")}

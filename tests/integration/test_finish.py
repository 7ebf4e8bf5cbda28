"""A run's end: written under its fence, in one statement on PostgreSQL, as on the ORM path."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from django_cluster_jobs.coordination import Won
from django_cluster_jobs.models import RunEvent, RunState
from tests.factories import RunningRunFactory

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)


def won_of(run, fence=None) -> Won:
    return Won(run.pk, run.job_id, run.key, run.fence if fence is None else fence, run.attempt)


@pytest.mark.parametrize("result", [None, {"rows": 3}, [1, "two"], 7])
def test_an_end_under_the_fence_is_written_with_its_entry(ledger, result):
    run = RunningRunFactory(fence=4)
    assert ledger.runs.finish(won_of(run), "node-a", RunState.SUCCEEDED, NOW, result=result)
    run.refresh_from_db()
    assert (run.state, run.finished_at, run.result, run.lease_expires_at) == (
        RunState.SUCCEEDED, NOW, result, None,
    )  # fmt: skip
    [event] = RunEvent.objects.filter(run=run)
    assert (event.kind, event.node, event.fence, event.at) == ("succeeded", "node-a", 4, NOW)


def test_a_stale_fence_changes_nothing_and_is_recorded_as_fenced_out(ledger):
    run = RunningRunFactory(fence=5)
    written = ledger.runs.finish(
        won_of(run, fence=4), "node-a", RunState.FAILED, NOW, error="boom", traceback="tb"
    )
    assert written is False
    run.refresh_from_db()
    assert (run.state, run.error, run.finished_at) == (RunState.RUNNING, "", None)
    [event] = RunEvent.objects.filter(run=run)
    assert event.kind == "fenced_out" and "fence 4 is stale" in event.reason


def test_a_failure_records_its_error_and_traceback_in_the_entry(ledger):
    run = RunningRunFactory()
    ledger.runs.finish(won_of(run), "n", RunState.FAILED, NOW, error="boom", traceback="tb")
    assert RunEvent.objects.get(run=run).reason == "boom\n\ntb"
    assert RunEvent.objects.get(run=run).kind == "failed"


@pytest.mark.postgresql
def test_an_end_on_postgresql_is_one_statement(ledger):
    run = RunningRunFactory()
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert ledger.runs.finish(won_of(run), "n", RunState.SUCCEEDED, NOW, result={"a": 1})
    if ledger.vendor.name == "postgresql":
        assert len(sent) == 1, sent

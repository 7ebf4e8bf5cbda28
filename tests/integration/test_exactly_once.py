"""delivery="exactly_once": the handler's writes to the ledger's database and the run's fenced
end commit together, or neither does.

``tests.effects_once`` writes two Effect rows per attempt (one before and one after the point
where a test makes it fail, be taken over or enqueue), so a half-applied attempt would show as
one row, a repeated one as more than two.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_cluster_jobs import services
from django_cluster_jobs.engine import Node
from django_cluster_jobs.models import EventKind, JobRun, RunEvent, RunState
from tests import timing
from tests.conftest import wait_until
from tests.models import Effect
from tests.nodes import served, take_all

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timing]


@pytest.fixture
def node():
    node = Node("once", threads=2)
    node.start()
    yield node
    node.stop()


def effects(run: JobRun) -> list[int]:
    """The attempt of each Effect row the run's handler left."""
    return sorted(Effect.objects.filter(key=run.key).values_list("attempt", flat=True))


def test_a_successful_run_commits_its_writes_with_its_end(node):
    run = served(node, services.enqueue("tests.effects_once"))
    assert (run.state, run.attempt, run.result) == (RunState.SUCCEEDED, 1, 1)
    assert effects(run) == [1, 1]


def test_a_failed_attempt_leaves_no_writes_and_its_retry_applies_them_once(node):
    run = served(node, services.enqueue("tests.effects_once", {"fail_until": 1}))
    assert (run.state, run.attempt) == (RunState.SUCCEEDED, 2)
    assert effects(run) == [2, 2]  # the first attempt's row was rolled back with it
    failed = RunEvent.objects.filter(run=run, kind=EventKind.FAILED)
    assert [e.reason.split("\n")[0] for e in failed] == ["RuntimeError: attempt 1 fails half-way"]


def test_a_failed_last_attempt_leaves_no_writes(node):
    run = served(node, services.enqueue("tests.effects_once", {"fail_until": 2}))
    assert run.attempt == 2 and run.state in (RunState.FAILED, RunState.DEAD)
    assert effects(run) == []


def test_runs_enqueued_by_a_rolled_back_attempt_never_exist(node):
    run = served(node, services.enqueue("tests.effects_once", {"fail_until": 1, "enqueue": True}))
    assert (run.state, run.attempt) == (RunState.SUCCEEDED, 2)
    inner = JobRun.objects.filter(job__name="tests.manual", key=f"enqueued:inner-{run.key}")
    assert [r.payload for r in inner] == [{"value": 2}]  # the second attempt's alone


@pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="on SQLite the attempt's transaction holds the one writer lock from its start: no "
    "other connection can move the fence before it ends",
)
def test_a_fence_moved_before_the_end_rolls_the_writes_back_and_is_recorded(node):
    run = services.enqueue("tests.effects_once", {"taken_over": True})
    fenced = RunEvent.objects.filter(run=run, kind=EventKind.FENCED_OUT)
    wait_until(lambda: take_all(node) or fenced.exists(), timing.RUN_ENDS)
    assert effects(run) == []
    # The newer owner's to end (here nobody's: its lease will expire and it runs again).
    assert JobRun.objects.get(pk=run.pk).state in (RunState.RUNNING, RunState.PENDING)


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="only PostgreSQL leaves a transaction unusable after an error in it",
)
def test_a_handler_that_breaks_its_transaction_fails_with_the_fix(node):
    run = served(node, services.enqueue("tests.effects_once", {"swallow": True}))
    assert run.state in (RunState.FAILED, RunState.DEAD) and effects(run) == []
    assert "wrap what may fail in transaction.atomic()" in run.error

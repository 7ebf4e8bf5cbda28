"""Many definitions: what a start, a change and a catch-up pass touch is what changed, not all.

Counted, not timed: statements sent (CaptureQueriesContext), jobs pushed onto a node's plan,
definitions a catch-up pass reads.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_cluster_jobs import job
from django_cluster_jobs.engine import Node, catchup
from django_cluster_jobs.engine.planner import Planned
from django_cluster_jobs.engine.registration import sync_definitions
from django_cluster_jobs.ledger.changes import create_definitions
from django_cluster_jobs.ledger.settle import JOBS_PER_QUERY, NEVER, next_to_settle
from django_cluster_jobs.models import JobDefinition, JobRun, RunState, ScheduleKind
from django_cluster_jobs.registry import registry
from django_cluster_jobs.schedules import occurrence_key
from tests.factories import JobDefinitionFactory, WorkerNodeFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("registry_restored")]

#: More jobs than one ledger query takes, so every batching is exercised.
MANY = 2 * JOBS_PER_QUERY + 50


def declared(count: int, cron: str = "0 3 * * *") -> list:
    def noop() -> None:
        return None

    return [job(name=f"scale.code.{i:04d}", cron=cron)(noop) for i in range(count)]


def stored(count: int, cron: str = "0 3 * * *", **fields) -> list[JobDefinition]:
    """``count`` database jobs, created as the scheduler's sync creates many at once."""
    rows = [
        JobDefinition(
            name=f"scale.db.{i:04d}",
            callable_name="tests.manual",
            schedule_kind=ScheduleKind.CRON,
            cron=cron,
            **fields,
        )
        for i in range(count)
    ]
    create_definitions("default", rows)
    return list(JobDefinition.objects.filter(name__startswith="scale.db.").order_by("pk"))


def test_a_start_with_many_unchanged_code_jobs_sends_a_few_statements():
    jobs = declared(MANY)
    sync_definitions(jobs, "default")
    assert JobDefinition.objects.filter(name__startswith="scale.code.").count() == MANY
    with CaptureQueriesContext(connection) as first_again:
        sync_definitions(jobs, "default")
    assert len(first_again) <= MANY // JOBS_PER_QUERY + 1, "one read per batch of names"

    jobs[7] = job(name=jobs[7].name, cron="0 4 * * *")(jobs[7].func)  # changed in code
    with CaptureQueriesContext(connection) as one_changed:
        sync_definitions(jobs, "default")
    assert JobDefinition.objects.get(name=jobs[7].name).cron == "0 4 * * *"
    assert len(one_changed) <= len(first_again) + 12, "only the changed row is saved"


def test_creating_many_code_jobs_at_once_settles_each_through_its_creation():
    with CaptureQueriesContext(connection) as created:
        sync_definitions(declared(MANY), "default")
    assert len(created) <= MANY // 10, "batched (as many rows a statement as SQLite takes)"
    rows = JobDefinition.objects.filter(name__startswith="scale.code.")
    marks = set(rows.values_list("settled_through", flat=True))
    assert len(marks) == 1 and None not in marks
    [mark] = marks
    assert set(rows.values_list("next_to_settle", flat=True)) == {
        next_to_settle(rows.first(), mark)
    }


@pytest.fixture
def planned_node():
    stored(MANY)
    node = Node("scale", threads=1)
    node.start()
    yield node
    node.stop()


def pushes(node: Node) -> list[str]:
    """Record the jobs the node plans again (from their definition) from now on."""
    seen: list[str] = []
    plan_first = node.claimer._plan_first

    def counted(planned: Planned, now: datetime) -> None:
        seen.append(planned.name)
        plan_first(planned, now)

    node.claimer._plan_first = counted  # type: ignore[method-assign]
    return seen


def test_a_changed_definition_re_plans_that_job_only(planned_node):
    node = planned_node
    assert len([n for n in node.planned if n.startswith("scale.db.")]) == MANY
    pushed = pushes(node)
    changed = JobDefinition.objects.get(name="scale.db.0005")
    changed.cron = "30 4 * * *"
    changed.save()
    node.request_reload()  # what the heartbeat does when the definitions counter moved
    node.tick()
    assert pushed == ["scale.db.0005"]
    assert node.planned["scale.db.0005"].definition.cron == "30 4 * * *"


def test_a_pause_and_an_update_fields_save_are_changes_too(planned_node):
    from django_cluster_jobs import services

    node = planned_node
    pushed = pushes(node)
    services.pause("scale.db.0001")  # saves only the pause's columns
    node.request_reload()
    node.tick()
    assert pushed == ["scale.db.0001"]
    assert node.planned["scale.db.0001"].definition.paused_until is not None


def test_deleted_renamed_and_retagged_definitions_leave_the_plan(planned_node):
    node = planned_node
    pushed = pushes(node)
    JobDefinition.objects.get(name="scale.db.0002").delete()
    renamed = JobDefinition.objects.get(name="scale.db.0003")
    renamed.name = "scale.renamed"
    renamed.save()
    elsewhere = JobDefinition.objects.get(name="scale.db.0004")
    elsewhere.requires = ["gpu"]  # a tag this node lacks
    elsewhere.save()
    node.request_reload()
    node.tick()
    assert sorted(pushed) == ["scale.renamed"]
    assert {"scale.db.0002", "scale.db.0003", "scale.db.0004"}.isdisjoint(node.planned)
    assert {p.definition.pk for p in node.planned.values()} == set(node.claimer.by_pk)
    planned = {name for _, name in node.claimer.planner.pop_due(NEVER)}
    assert "scale.renamed" in planned
    assert {"scale.db.0002", "scale.db.0003", "scale.db.0004"}.isdisjoint(planned)


def test_a_refused_claim_re_plans_its_job_even_when_nothing_else_changed(planned_node):
    node = planned_node
    pushed = pushes(node)
    node.request_reload({"scale.db.0006"})
    node.tick()
    assert pushed == ["scale.db.0006"]


def test_a_failed_tick_re_plans_every_job(planned_node, monkeypatch):
    node = planned_node
    pushed = pushes(node)

    def broken(now: datetime) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(node.claimer, "tick", broken)
    monkeypatch.setattr("django_cluster_jobs.engine.node.TICK_BACKOFF", 0.0)
    node.tick()
    monkeypatch.undo()
    node.tick()
    assert set(pushed) == set(node.planned)


def test_looking_for_pending_runs_of_many_jobs_sends_one_short_statement():
    from django_cluster_jobs.ledger import get_ledger

    ids = [row.pk for row in stored(MANY)]
    with CaptureQueriesContext(connection) as looked:
        assert get_ledger().next_pending_due(ids) is None
    [statement] = looked.captured_queries
    assert str(ids[-1]) not in statement["sql"]


# -- the leader's catch-up ------------------------------------------------------------------

NOW = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)


def settled_at(rows: list[JobDefinition], mark: datetime) -> None:
    """Settle these jobs through ``mark``, as a pass of the leader up to it would."""
    JobDefinition.objects.filter(pk__in=[r.pk for r in rows]).update(settled_through=mark)
    for row in JobDefinition.objects.filter(pk__in=[r.pk for r in rows]):
        JobDefinition.objects.filter(pk=row.pk).update(next_to_settle=next_to_settle(row, mark))


def test_a_catch_up_pass_reads_only_the_jobs_with_something_to_settle():
    WorkerNodeFactory(node_id="other", last_heartbeat=NOW, started_at=NOW - timedelta(hours=1))
    quiet = stored(MANY)  # daily at 03:00: nothing to settle between 08:50 and 09:00
    due = JobDefinitionFactory(name="scale.minutely", cron="* * * * *")
    settled_at([*quiet, due], NOW - timedelta(minutes=10))

    read = []
    definitions = catchup._definitions

    def reading(*args):
        found = definitions(*args)
        read.append(len(found))
        return found

    with CaptureQueriesContext(connection) as passed, pytest.MonkeyPatch.context() as patch:
        patch.setattr(catchup, "_definitions", reading)
        written = catchup.catch_up("default", registry.names(), "leader", NOW, everything=False)
    assert written == 9, "08:51 … 08:59 settled (fire_once queues the latest, the rest missed)"
    assert read == [1], "the one job with something to settle"
    assert len(passed) <= 20
    assert JobRun.objects.filter(job=due).count() == 9
    assert not JobRun.objects.exclude(job=due).exists()
    due.refresh_from_db()
    assert due.settled_through > NOW - timedelta(seconds=15)
    assert due.next_to_settle == datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
    quiet_marks = set(
        JobDefinition.objects.filter(pk__in=[q.pk for q in quiet]).values_list(
            "settled_through", flat=True
        )
    )
    assert quiet_marks == {NOW - timedelta(minutes=10)}, "left where they were, safely"

    with CaptureQueriesContext(connection) as again:  # nothing new: a few statements
        assert catchup.catch_up("default", registry.names(), "leader", NOW, everything=False) == 0
    assert len(again) <= 8


def test_a_quiet_job_is_settled_once_its_next_occurrence_is_reached():
    WorkerNodeFactory(node_id="other", last_heartbeat=NOW, started_at=NOW)
    [daily] = stored(1, cron="55 8 * * *")
    settled_at([daily], NOW - timedelta(hours=1))
    early = NOW - timedelta(minutes=30)
    WorkerNodeFactory(node_id="first", last_heartbeat=early, started_at=early - timedelta(hours=2))
    names = registry.names()
    assert catchup.catch_up("default", names, "leader", early, everything=False) == 0
    assert JobDefinition.objects.get(pk=daily.pk).settled_through == NOW - timedelta(hours=1)
    # Later: 08:55 passed and no node claimed it.
    catchup.catch_up("default", names, "leader", NOW, everything=False)
    [run] = JobRun.objects.filter(job=daily)
    assert run.key == occurrence_key(datetime(2026, 5, 28, 8, 55, tzinfo=UTC))
    assert run.state == RunState.PENDING  # fire_once: caught up


def test_a_pass_over_everything_moves_the_quiet_marks_too():
    WorkerNodeFactory(node_id="other", last_heartbeat=NOW, started_at=NOW)
    quiet = stored(5)
    settled_at(quiet, NOW - timedelta(hours=1))
    catchup.catch_up("default", registry.names(), "leader", NOW, everything=True)
    marks = set(
        JobDefinition.objects.filter(pk__in=[q.pk for q in quiet]).values_list(
            "settled_through", flat=True
        )
    )
    assert len(marks) == 1 and marks.pop() > NOW - timedelta(seconds=15)
    assert not JobRun.objects.exists()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, datetime(2026, 5, 29, 3, 0, tzinfo=UTC)),
        ({"enabled": False}, NEVER),
        ({"placement": "every_node"}, NEVER),
        ({"schedule_kind": ScheduleKind.DELAY, "cron": "", "interval": timedelta(hours=1)}, NEVER),
        ({"paused_until": datetime(9999, 12, 31, tzinfo=UTC)}, NEVER),
        (
            {"paused_until": datetime(2026, 6, 2, 12, 0, tzinfo=UTC)},
            datetime(2026, 6, 3, 3, 0, tzinfo=UTC),
        ),
        (
            {"paused_until": datetime(2026, 6, 2, 3, 0, tzinfo=UTC)},
            datetime(2026, 6, 2, 3, 0, tzinfo=UTC),
        ),
    ],
)
def test_next_to_settle_is_the_first_occurrence_settling_may_decide(fields, expected):
    fields = {"schedule_kind": ScheduleKind.CRON, "cron": "0 3 * * *", **fields}
    row = JobDefinition(name="x", callable_name="tests.manual", **fields)
    assert next_to_settle(row, NOW) == expected


def test_every_save_keeps_next_to_settle_in_step():
    from django_cluster_jobs import services

    row = JobDefinitionFactory(name="kept", cron="0 3 * * *")
    assert row.next_to_settle == next_to_settle(row, row.settled_through)
    services.pause("kept")  # update_fields
    row.refresh_from_db()
    assert row.next_to_settle == NEVER
    services.resume("kept")
    row.refresh_from_db()
    assert row.next_to_settle == next_to_settle(row, row.settled_through) != NEVER
    row.cron = "0 4 * * *"
    row.save()
    row.refresh_from_db()
    assert row.next_to_settle.hour == 4
    row.priority = 3
    row.save(update_fields=["priority"])  # not a change of what is due: kept
    assert JobDefinition.objects.get(pk=row.pk).next_to_settle == row.next_to_settle


def test_a_job_another_starts_or_stops_waiting_for_is_planned_again_as_leading(planned_node):
    """Its own row did not change, but whether its end must decide dependents did: the node's
    copy says so after the reload that read the dependent (else its end would queue nothing)."""
    node = planned_node
    assert node.planned["scale.db.0002"].leads is False
    pushed = pushes(node)
    dependent = JobDefinition.objects.get(name="scale.db.0003")
    dependent.schedule_kind, dependent.cron = ScheduleKind.ON_DEMAND, ""
    dependent.after = ["scale.db.0002"]
    dependent.save()
    node.request_reload()
    node.tick()
    assert sorted(pushed) == ["scale.db.0002", "scale.db.0003"]
    assert node.planned["scale.db.0002"].leads is True
    pushed.clear()
    dependent.after = []
    dependent.save()
    node.request_reload()
    node.tick()
    assert node.planned["scale.db.0002"].leads is False

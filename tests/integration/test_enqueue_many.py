"""Bulk enqueue: one INSERT, all or nothing, idempotent per key, one notification per call."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from django_cluster_jobs import ImproperlyDeclared, InvalidPayload, RunRequest, services
from django_cluster_jobs.models import JobRun, RunState
from django_cluster_jobs.registry import registry
from tests import timing
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LATER = datetime(2030, 1, 1, tzinfo=UTC)


def statements(call):
    """Run ``call``; return what it returned and the first word of each statement it sent."""
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        result = call()
    return result, sent


@pytest.mark.parametrize("size", [1, 2, 2000])
def test_every_item_becomes_one_pending_run_in_item_order(size):
    runs = services.enqueue_many("tests.manual", [{"value": i} for i in range(size)])
    assert [r.payload for r in runs] == [{"value": i} for i in range(size)]
    assert len({r.pk for r in runs}) == size and all(r.pk for r in runs)
    stored = JobRun.objects.filter(job__name="tests.manual", state=RunState.PENDING)
    assert stored.count() == size
    assert sorted(stored.values_list("payload__value", flat=True)) == list(range(size))


def test_one_invalid_item_stores_nothing_and_names_the_item():
    items = [{"value": 1}, {"value": 2}, {"nope": 3}]
    with pytest.raises(InvalidPayload) as caught:
        services.enqueue_many("tests.manual", items)
    message = str(caught.value)
    assert "'tests.manual'" in message and "item 2" in message and "nope" in message
    assert not JobRun.objects.exists()


def test_an_invalid_priority_of_one_item_names_the_field_the_index_and_the_value():
    items = [RunRequest({"value": 1}), RunRequest({"value": 2}, priority=10_000)]
    with pytest.raises(ImproperlyDeclared) as caught:
        services.enqueue_many("tests.manual", items)
    error = caught.value
    assert (error.job, error.field, error.value) == ("tests.manual", "priority of item 1", 10_000)
    assert error.hint and error.hint in str(error)
    assert not JobRun.objects.exists()


def test_an_invalid_shared_argument_is_refused_before_anything_is_stored():
    with pytest.raises(ImproperlyDeclared, match="priority"):
        services.enqueue_many("tests.manual", [{"value": 1}], priority="high")
    assert not JobRun.objects.exists()


def test_a_payload_that_is_not_json_names_its_item():
    with pytest.raises(InvalidPayload, match="item 1"):
        services.enqueue_many("tests.manual", [{"value": 1}, {"value": object()}])
    assert not JobRun.objects.exists()


def test_an_existing_key_returns_the_existing_run_and_stores_the_others():
    first = services.enqueue("tests.manual", {"value": 1}, key="order-1")
    runs = services.enqueue_many(
        "tests.manual",
        [RunRequest({"value": 9}, key="order-1"), RunRequest({"value": 2}, key="order-2")],
    )
    assert runs[0].pk == first.pk and runs[0].payload == {"value": 1}
    assert runs[1].pk != first.pk and runs[1].payload == {"value": 2}
    assert JobRun.objects.count() == 2
    again = services.enqueue_many("tests.manual", [RunRequest({"value": 2}, key="order-2")])
    assert [r.pk for r in again] == [runs[1].pk] and JobRun.objects.count() == 2


def test_a_key_repeated_inside_one_call_is_one_run():
    items = [RunRequest({"value": 1}, key="k"), {"value": 5}, RunRequest({"value": 2}, key="k")]
    runs = services.enqueue_many("tests.manual", items)
    assert runs[0].pk == runs[2].pk != runs[1].pk
    assert runs[2].payload == {"value": 1}, "the first occurrence of a key wins"
    assert JobRun.objects.count() == 2


def test_per_item_priority_and_due_time_override_the_call_s():
    items = [RunRequest({"value": 1}, priority=7, at=LATER), {"value": 2}]
    runs = services.enqueue_many("tests.manual", items, priority=3, at=LATER + timedelta(days=1))
    stored = {r.pk: r for r in JobRun.objects.all()}
    first, second = stored[runs[0].pk], stored[runs[1].pk]
    assert (first.priority, first.due_at) == (7, LATER)
    assert (second.priority, second.due_at) == (3, LATER + timedelta(days=1))


def test_the_whole_call_is_one_definition_read_and_one_insert_and_notifies_once():
    services.definition_for("tests.manual")
    runs, sent = statements(
        lambda: services.enqueue_many("tests.manual", [{"value": i} for i in range(50)])
    )
    assert len(runs) == 50
    kinds = [sql.split(None, 1)[0].upper() for sql in sent if "pg_notify" not in sql]
    kinds = [k for k in kinds if k not in ("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT")]
    if connection.vendor == "postgresql":
        assert kinds == ["SELECT", "INSERT"], sent
    assert kinds[0] == "SELECT" and set(kinds[1:]) == {"INSERT"}, sent
    assert sum("pg_notify" in sql for sql in sent) == (connection.vendor == "postgresql")


def test_a_rolled_back_transaction_takes_every_run_with_it():
    with pytest.raises(RuntimeError), transaction.atomic():
        services.enqueue_many("tests.manual", [{"value": 1}, {"value": 2}])
        raise RuntimeError("rolled back")
    assert not JobRun.objects.exists()


def test_the_job_s_bulk_form_takes_payloads_and_requests():
    manual = registry.get("tests.manual")
    runs = manual.enqueue_many([{"value": 1}, RunRequest({"value": 2}, key="x")], priority=4)
    assert [r.payload for r in runs] == [{"value": 1}, {"value": 2}]
    assert {r.priority for r in JobRun.objects.all()} == {4}
    assert JobRun.objects.get(pk=runs[1].pk).key.endswith(":x")


@pytest.mark.timing
def test_runs_enqueued_in_bulk_are_taken_and_run_by_a_real_node(start_scheduler):
    runs = services.enqueue_many("tests.manual", [{"value": i} for i in range(40)])
    ids = [r.pk for r in runs]
    scheduler = start_scheduler("bulk-node", "--threads", "4")
    done = JobRun.objects.filter(pk__in=ids, state=RunState.SUCCEEDED)
    # The node starts, then takes the 40 runs (milliseconds each) on its 4 threads.
    wait_until(lambda: done.count() == len(ids) or scheduler.proc.poll() is not None,
               timeout=timing.NODE_START + timing.RUN_ENDS)  # fmt: skip
    assert done.count() == len(ids), scheduler.output()
    assert sorted(done.values_list("result", flat=True)) == sorted(2 * i for i in range(40))

"""Two real nodes keep serving a healthy job while the test stores poison: nothing stops them."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs import services
from django_cluster_jobs.ledger import get_ledger
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from tests.conftest import wait_until
from tests.ledger_checks import assert_every_occurrence_once
from tests.models import Effect
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, REACT, RUN_ENDS, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

JOB = "tests.every_second"
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)


def test_two_nodes_serve_on_while_poisoned_definitions_runs_and_results_arrive(start_scheduler):
    nodes = [
        start_scheduler(n, "--duration", f"{SERVES:g}", jobs="every_second") for n in ("c1", "c2")
    ]
    every = JobRun.objects.filter(job__name=JOB)
    wait_until(lambda: every.count() >= 2, FEW_SECONDS_OF_RUNS)
    poisoned_at = timezone.now()
    manual = JobDefinition.objects.get(name="tests.manual")
    # A definition an old version (or a raw SQL write) stored, that no validator checked.
    cron = {"callable_name": "tests.manual", "schedule_kind": "cron"}
    JobDefinition.objects.create(name="poison.cron", cron="61 * * * *", **cron)
    JobDefinition.objects.create(
        name="poison.tz", cron="* * * * *", timezone="Mars/Olympus", **cron
    )
    poison_run = JobRun.objects.create(
        job=manual, key="poison:list", scheduled_at=poisoned_at, due_at=poisoned_at,
        state=RunState.PENDING, payload=[1, 2], created_at=poisoned_at,
    )  # fmt: skip
    huge = JobRun.objects.create(
        job=manual, key="poison:priority", scheduled_at=poisoned_at,
        due_at=datetime(1, 1, 1, tzinfo=UTC), priority=2_000_000_000,
        state=RunState.PENDING, payload={"value": 1}, created_at=poisoned_at,
    )  # fmt: skip
    odd = services.enqueue("tests.odd_result", {"kind": "nested"})
    get_ledger().vendor.notify_pending()  # the raw rows above were written without a notification

    done = (RunState.SUCCEEDED, RunState.FAILED)
    ends = JobRun.objects.filter(pk__in=[poison_run.pk, huge.pk, odd.pk], state__in=done)
    wait_until(lambda: ends.count() == 3, RUN_ENDS)
    # Both nodes re-planned with the poisoned definitions, and the healthy job keeps firing
    # after all of it: three more occurrences claimed once the poisoned runs ended.
    for name in ("poison.cron", "poison.tz"):
        wait_until(lambda name=name: left_out_by_all(nodes, name), REACT)
    ended = timezone.now()
    wait_until(lambda: every.filter(scheduled_at__gt=ended).count() >= 3, FEW_SECONDS_OF_RUNS)
    for node in nodes:
        assert node.proc.poll() is None, f"{node.node_id} stopped:\n{node.output()}"
    for node in nodes:
        node.signal(signal.SIGTERM)
    for node in nodes:
        assert node.wait(timeout=NODE_EXIT) == 0, node.output()

    poison_run.refresh_from_db(), huge.refresh_from_db(), odd.refresh_from_db()
    assert poison_run.state == RunState.FAILED and "InvalidPayload" in poison_run.error
    assert (huge.state, huge.result) == (RunState.SUCCEEDED, 2)
    assert (odd.state, odd.result) == (RunState.SUCCEEDED, {"when": ["2"], "text": "a\ufffdb"})
    assert odd.attempt == 1 and Effect.objects.filter(key=odd.key).count() == 1
    for name in ("poison.cron", "poison.tz"):
        assert not JobRun.objects.filter(job__name=name).exists()
    # Every second from the first the nodes fired to the last has its one row: none ran twice,
    # none was missed while the poison arrived, and each skip names a live run that ran.
    outputs = "\n".join(node.output() for node in nodes)
    seconds = assert_every_occurrence_once(JOB, step=timedelta(seconds=1), least=5, context=outputs)
    assert seconds[-1] > ended, seconds


def left_out_by_all(nodes, name: str) -> bool:
    """Every node logged that it left the job out of its plan."""
    return all(f"job {name!r} is not planned" in node.output() for node in nodes)

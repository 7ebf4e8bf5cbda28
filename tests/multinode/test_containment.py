"""Two real nodes keep serving a healthy job while the test stores poison: nothing stops them."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs import services
from django_cluster_jobs.ledger import get_ledger
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from tests.conftest import wait_until
from tests.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

JOB = "tests.every_second"


def test_two_nodes_serve_on_while_poisoned_definitions_runs_and_results_arrive(start_scheduler):
    nodes = [start_scheduler(n, "--duration", "20", jobs="every_second") for n in ("c1", "c2")]
    wait_until(lambda: JobRun.objects.filter(job__name=JOB).count() >= 2, 30)
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
    wait_until(lambda: ends.count() == 3, 20)
    time.sleep(3)  # the healthy job keeps firing after the poison too
    for node in nodes:
        assert node.proc.poll() is None, f"{node.node_id} stopped:\n{node.output()}"
    for node in nodes:
        assert node.wait(timeout=40) == 0, node.output()

    poison_run.refresh_from_db(), huge.refresh_from_db(), odd.refresh_from_db()
    assert poison_run.state == RunState.FAILED and "InvalidPayload" in poison_run.error
    assert (huge.state, huge.result) == (RunState.SUCCEEDED, 2)
    assert (odd.state, odd.result) == (RunState.SUCCEEDED, {"when": ["2"], "text": "a\ufffdb"})
    assert odd.attempt == 1 and Effect.objects.filter(key=odd.key).count() == 1
    for name in ("poison.cron", "poison.tz"):
        assert not JobRun.objects.filter(job__name=name).exists()
        outputs = [node.output() for node in nodes]
        assert all(f"job {name!r} is not planned" in out for out in outputs), outputs
    seconds = sorted(JobRun.objects.filter(job__name=JOB).values_list("scheduled_at", flat=True))
    gaps = [(a, b) for a, b in itertools.pairwise(seconds) if b - a != timedelta(seconds=1)]
    assert not gaps and seconds[-1] > poisoned_at + timedelta(seconds=3), gaps
    assert set(JobRun.objects.filter(job__name=JOB).values_list("state", flat=True)) == {
        RunState.SUCCEEDED
    }

"""A schedule added, then edited, in the admin fires on a running node without a restart."""

from __future__ import annotations

import itertools
import signal
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs.models import (
    JobDefinition,
    JobRun,
    Lease,
    NodeStatus,
    RunState,
    WorkerNode,
)
from tests.admin.pages import url
from tests.admin.test_admin import add_job, form_data
from tests.conftest import wait_until
from tests.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

NAME = "admin.manual-every-second"
#: How long after a save every node must have re-planned: one heartbeat (0.5 s in the test
#: settings), the reload and a tick, with room for a loaded machine.
PICK_UP = timedelta(seconds=1.5)


def scheduled(**filters: object) -> list[datetime]:
    runs = JobRun.objects.filter(job__name=NAME, **filters)
    return sorted(runs.values_list("scheduled_at", flat=True))


def wait_for(node, predicate, timeout: float, what: str) -> None:
    """wait_until, failing with the node's log and the ledger so far."""
    try:
        wait_until(predicate, timeout)
    except pytest.fail.Exception:
        runs = JobRun.objects.filter(job__name=NAME).values_list("key", "state", "created_at")
        pytest.fail(f"{what} within {timeout}s; runs: {list(runs)}\n{node.output()}")


def gaps(instants: list[datetime], step: timedelta) -> list[tuple[datetime, datetime]]:
    return [(a, b) for a, b in itertools.pairwise(instants) if b - a != step]


#: Two ways to make it fire every 2 seconds: a cron edit, and a switch to a fixed rate (whose
#: grid is anchored to the cluster's epoch, so its slots are the even seconds too).
EDITS = {
    "cron": {"cron": "*/2 * * * * *"},
    "every": {"schedule_kind": "every", "interval": "00:00:02", "cron": ""},
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_schedule_added_and_edited_in_the_admin_fires_without_restart(
    start_scheduler, admin_client, edit
):
    node = start_scheduler("n1", "--duration", "30")
    # Running: its first heartbeat is done once it holds the leader lease (it is alone).
    leads = Lease.objects.filter(name="leader", holder="n1")
    wait_for(node, leads.exists, 20, "the node did not start")

    response = add_job(admin_client, name=NAME, cron="* * * * * *", payload='{"value": 3}')
    assert response.status_code == 302, response.context["adminform"].form.errors
    added = timezone.now()
    wait_for(node, lambda: len(scheduled(state=RunState.SUCCEEDED)) >= 3, 10, "no runs")
    assert scheduled()[0] <= added + PICK_UP + timedelta(seconds=1), node.output()
    results = JobRun.objects.filter(job__name=NAME, state=RunState.SUCCEEDED)
    assert set(results.values_list("result", flat=True)) == {6}

    job = JobDefinition.objects.get(name=NAME)
    path = url("jobdefinition", "change", job.pk)
    response = admin_client.post(path, form_data(admin_client, path, **EDITS[edit]))
    assert response.status_code == 302, response.context["adminform"].form.errors
    edited = timezone.now()

    def settled() -> bool:
        return len(scheduled(scheduled_at__gt=edited + PICK_UP)) >= 4

    wait_for(node, settled, 15, "no runs after the edit")
    assert node.proc.poll() is None, "the node stopped or restarted"
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=20) == 0, node.output()

    assert_ran_once_each()
    assert_schedule_followed(edited, node.output())
    assert WorkerNode.objects.get(node_id="n1").status == NodeStatus.STOPPED


def assert_ran_once_each() -> None:
    runs = JobRun.objects.filter(job__name=NAME)
    assert set(runs.values_list("state", flat=True)) == {RunState.SUCCEEDED}
    assert set(runs.values_list("result", flat=True)) == {6}
    per_key = Counter(Effect.objects.filter(job=NAME).values_list("key", flat=True))
    assert set(per_key) == set(runs.values_list("key", flat=True))
    assert set(per_key.values()) == {1}, "an occurrence ran twice"


def assert_schedule_followed(edited: datetime, output: str) -> None:
    before, after = scheduled(scheduled_at__lte=edited), scheduled(scheduled_at__gt=edited)
    assert not gaps(before, timedelta(seconds=1)), f"missed before the edit:\n{output}"
    odd = [at for at in after if at.second % 2]
    assert not odd or max(odd) <= edited + PICK_UP, f"old schedule kept firing: {odd}\n{output}"
    # Even seconds fire under both schedules, so none may be missing across the edit.
    evens = [at for at in before + after if at.second % 2 == 0]
    assert len(evens) >= 4
    assert not gaps(evens, timedelta(seconds=2)), f"missed or doubled across the edit:\n{output}"
    assert all(at.microsecond == 0 for at in after)

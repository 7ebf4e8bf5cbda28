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
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, NODE_START, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

NAME = "admin.manual-every-second"
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)
#: How far the test's clock and a node's cluster time (the database's clock as the node measured
#: it) may disagree.
CLOCK_ERROR = timedelta(seconds=scaled(0.1))
#: What a skip of the overlap policy "skip" (the default) records: the previous run is live.
OVERLAP_SKIP = "overlap: the previous run is still live"


def mark() -> datetime:
    """The job's settled-through mark: right after a save, that change's instant in cluster time
    (the leader moves a mark only up to its horizon, seconds in the past)."""
    return JobDefinition.objects.get(name=NAME).settled_through


def next_second(instant: datetime) -> datetime:
    return instant.replace(microsecond=0) + timedelta(seconds=1)


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
    node = start_scheduler("n1", "--duration", f"{SERVES:g}")
    # Running: its first heartbeat is done once it holds the leader lease (it is alone).
    leads = Lease.objects.filter(name="leader", holder="n1")
    wait_for(node, leads.exists, NODE_START, "the node did not start")

    response = add_job(admin_client, name=NAME, cron="* * * * * *", payload='{"value": 3}')
    assert response.status_code == 302, response.context["adminform"].form.errors
    added = mark()

    def ran_three() -> bool:
        return len(scheduled(state=RunState.SUCCEEDED)) >= 3

    wait_for(node, ran_three, FEW_SECONDS_OF_RUNS, "no runs")
    # The running node picked the new job up and claimed its very first occurrence (late if it
    # re-planned after it, within the claim grace).
    assert scheduled()[0] == next_second(added), node.output()
    results = JobRun.objects.filter(job__name=NAME, state=RunState.SUCCEEDED)
    assert set(results.values_list("result", flat=True)) == {6}

    job = JobDefinition.objects.get(name=NAME)
    path = url("jobdefinition", "change", job.pk)
    response = admin_client.post(path, form_data(admin_client, path, **EDITS[edit]))
    assert response.status_code == 302, response.context["adminform"].form.errors
    edited = timezone.now()

    def settled() -> bool:
        return len(scheduled(scheduled_at__gt=edited)) >= 4

    wait_for(node, settled, FEW_SECONDS_OF_RUNS, "no runs after the edit")
    assert node.proc.poll() is None, "the node stopped or restarted"
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=NODE_EXIT) == 0, node.output()

    assert_ran_once_each()
    assert_schedule_followed(edited, node.output())
    assert WorkerNode.objects.get(node_id="n1").status == NodeStatus.STOPPED


def assert_ran_once_each() -> None:
    """Each occurrence ran once and succeeded, or was skipped by the overlap policy (its
    previous run was still live on a slow machine) and ran nothing."""
    runs = JobRun.objects.filter(job__name=NAME)
    ran = runs.exclude(state=RunState.SKIPPED)
    assert set(ran.values_list("state", flat=True)) == {RunState.SUCCEEDED}
    assert set(ran.values_list("result", flat=True)) == {6}
    skips = runs.filter(state=RunState.SKIPPED).values_list("reason", flat=True)
    assert all(reason.startswith(OVERLAP_SKIP) for reason in skips), list(skips)
    per_key = Counter(Effect.objects.filter(job=NAME).values_list("key", flat=True))
    assert set(per_key) == set(ran.values_list("key", flat=True))
    assert set(per_key.values()) == {1}, "an occurrence ran twice"


def assert_schedule_followed(edited: datetime, output: str) -> None:
    before, after = scheduled(scheduled_at__lte=edited), scheduled(scheduled_at__gt=edited)
    assert not gaps(before, timedelta(seconds=1)), f"missed before the edit:\n{output}"
    # A claim planned from the old definition is refused from the edit's commit on, whenever
    # the node re-plans: no odd second after the edit.
    odd = [at for at in after if at.second % 2]
    assert not odd or max(odd) <= edited + CLOCK_ERROR, f"old schedule kept firing: {odd}\n{output}"
    # Even seconds fire under both schedules, so none may be missing across the edit.
    evens = [at for at in before + after if at.second % 2 == 0]
    assert len(evens) >= 4
    assert not gaps(evens, timedelta(seconds=2)), f"missed or doubled across the edit:\n{output}"
    assert all(at.microsecond == 0 for at in after)

"""A schedule added, then edited, in the admin fires on a running node without a restart."""

from __future__ import annotations

import itertools
import signal
from datetime import datetime, timedelta

import pytest

from django_cluster_jobs import services
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
from tests.ledger_checks import assert_every_occurrence_once, cluster_time_error
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, NODE_START, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

NAME = "admin.manual-every-second"
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)


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
    changed = mark()  # the edit's instant, in its transaction
    edited = services.cluster_now()  # after the edit's commit, on the database's clock

    def settled() -> bool:
        return len(scheduled(scheduled_at__gt=changed)) >= 4

    wait_for(node, settled, FEW_SECONDS_OF_RUNS, "no runs after the edit")
    assert node.proc.poll() is None, "the node stopped or restarted"
    node.signal(signal.SIGTERM)
    assert node.wait(timeout=NODE_EXIT) == 0, node.output()

    # Each occurrence ran once and succeeded, or was skipped for a live run that ran (the
    # schedule changes at the edit: assert_schedule_followed checks that none is missing).
    assert_every_occurrence_once(NAME, least=7, context=node.output())
    ran = JobRun.objects.filter(job__name=NAME).exclude(state=RunState.SKIPPED)
    assert set(ran.values_list("result", flat=True)) == {6}
    assert_schedule_followed(changed, edited, node.output())
    assert WorkerNode.objects.get(node_id="n1").status == NodeStatus.STOPPED


def assert_schedule_followed(changed: datetime, edited: datetime, output: str) -> None:
    """The old schedule up to the edit's instant ``changed`` (each of its occurrences claimed,
    or settled by the edit), the new one after it; ``edited``: an instant after its commit."""
    before, after = scheduled(scheduled_at__lte=changed), scheduled(scheduled_at__gt=changed)
    assert not gaps(before, timedelta(seconds=1)), f"missed before the edit:\n{output}"
    # A claim planned from the old definition is refused from the edit's commit on, whenever
    # the node re-plans: an odd second after the edit's instant was claimed before its commit,
    # when the node's cluster time (off the database's clock by its error at most) had reached
    # it.
    odd = [at for at in after if at.second % 2]
    latest = edited + cluster_time_error()
    assert not odd or max(odd) <= latest, f"old schedule kept firing: {odd}\n{output}"
    # Even seconds fire under both schedules, so none may be missing across the edit.
    evens = [at for at in before + after if at.second % 2 == 0]
    assert len(evens) >= 4
    assert not gaps(evens, timedelta(seconds=2)), f"missed or doubled across the edit:\n{output}"
    assert all(at.microsecond == 0 for at in after)

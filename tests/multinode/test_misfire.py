"""An outage of the whole cluster, then three real nodes: each misfire policy settles it once."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    JobDefinition,
    JobRun,
    Outcome,
    RunState,
    WorkerNode,
)
from django_cluster_jobs.registry import registry
from django_cluster_jobs.schedules import Every, occurrence_key
from tests.models import Effect
from tests.timing import NODE_EXIT, NODE_START, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

STEP = timedelta(seconds=2)
#: Job name -> catch-up runs expected after the outage (tests/jobs.py: every 2 s).
POLICIES = {"tests.misfire_once": 1, "tests.misfire_skip": 0, "tests.misfire_all": 3}
OUTAGE = timedelta(seconds=30)
#: How long the three nodes serve after the outage: time for the leader's passes to reach the
#: occurrences the nodes did not claim at their start, and for several live occurrences.
CLUSTER_LIFE = scaled(12)


def before_the_outage() -> datetime:
    """Create the three jobs as a cluster that stopped OUTAGE ago left them: one run, settled
    through it by the leader of the time, then nothing."""
    last = Every(STEP).previous_at_or_before(timezone.now() - OUTAGE)
    for name in POLICIES:
        job = JobDefinition.objects.create(
            name=name, enabled=True, **registry.get(name).definition_fields()
        )
        JobDefinition.objects.filter(pk=job.pk).update(
            created_at=last - timedelta(minutes=1), settled_through=last
        )
        JobRun.objects.create(
            job=job,
            key=occurrence_key(last),
            scheduled_at=last,
            due_at=last,
            state=RunState.SUCCEEDED,
            outcome=Outcome.WON,
            node="gone",
            created_at=last,
            started_at=last,
            finished_at=last,
        )
    return last


def assert_contiguous(instants: list[datetime]) -> None:
    gaps = [(a, b) for a, b in itertools.pairwise(instants) if b - a != STEP]
    assert not gaps, f"missed or doubled occurrences between {gaps}"


def test_three_nodes_settle_an_outage_once_by_each_misfire_policy(start_scheduler):
    last = before_the_outage()
    jobs = "misfire_once,misfire_skip,misfire_all"
    nodes = [
        start_scheduler(f"m{i}", "--duration", f"{CLUSTER_LIFE:g}", jobs=jobs) for i in range(3)
    ]
    for node in nodes:
        assert node.wait(timeout=NODE_START + CLUSTER_LIFE + NODE_EXIT) == 0, node.output()

    for name, catch_ups in POLICIES.items():
        assert_settled_once(name, last, catch_ups)
    assert ClusterEvent.objects.filter(kind=ClusterEventKind.CAUGHT_UP).exists()
    # Each node resumed claiming on its own: every one of them tried each occurrence since.
    for node in WorkerNode.objects.all():
        assert node.claims_won + node.claims_lost >= 3, (node.node_id, node.skipped)


def assert_settled_once(name: str, last: datetime, catch_ups: int) -> None:
    runs = list(JobRun.objects.filter(job__name=name).order_by("scheduled_at"))
    live = next(r for r in runs if r.outcome == Outcome.WON and r.scheduled_at > last)
    gap = [r for r in runs if last < r.scheduled_at < live.scheduled_at]
    # One row per occurrence from the last run before the outage to the first one after it.
    assert_contiguous([last, *(r.scheduled_at for r in gap), live.scheduled_at])
    assert len(gap) >= OUTAGE // STEP - 1

    caught = [r for r in gap if r.outcome == Outcome.CATCH_UP]
    assert len(caught) == catch_ups, name
    assert {r.state for r in caught} <= {RunState.SUCCEEDED}, name
    ran = Effect.objects.filter(job=name, key__in=[r.key for r in gap])
    assert sorted(ran.values_list("key", flat=True)) == [r.key for r in caught], name
    rest = [r for r in gap if r.outcome != Outcome.CATCH_UP]
    assert {(r.state, r.outcome) for r in rest} == {(RunState.MISSED, Outcome.MISSED)}, name
    if caught:
        # The latest occurrences of the outage ran, consecutively; anything after them was only
        # seen in a later pass and is covered by their catch-up.
        assert_contiguous([r.scheduled_at for r in caught])
        after = gap[gap.index(caught[-1]) + 1 :]
        assert all("is already queued" in r.reason for r in after), name

"""The services behind the admin's bulk actions, raced on real connections: a pending run is
either cancelled or taken by a node, never both, and a dead letter is replayed once however many
operators replay it at the same moment."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs import services
from django_cluster_jobs.ledger import get_ledger
from django_cluster_jobs.models import EventKind, JobRun, RunEvent, RunState
from tests.factories import JobDefinitionFactory, JobRunFactory
from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 30


def test_a_pending_run_is_cancelled_or_taken_never_both():
    job = JobDefinitionFactory(name="bulk-race")
    now = timezone.now()
    runs = [JobRunFactory(job=job, state=RunState.PENDING, due_at=now - timedelta(seconds=1))
            for _ in range(RUNS)]  # fmt: skip
    ids = [run.pk for run in runs]

    def act(i: int) -> list[int]:
        if i == 0:
            return services.cancel_pending(ids, by="admin:alice")
        taken = []
        while won := get_ledger().vendor.take_pending(f"node-{i}", [job.pk], 3, now,
                                                      now + timedelta(seconds=30)):  # fmt: skip
            taken += [w.run_id for w in won]
        return taken

    cancelled, *taken_by = race(3, act)
    taken = [pk for node in taken_by for pk in node]
    assert sorted(cancelled + taken) == ids  # every run once, by one side
    states = dict(JobRun.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert {states[pk] for pk in cancelled} <= {RunState.CANCELLED}
    assert {states[pk] for pk in taken} <= {RunState.RUNNING}
    events = RunEvent.objects.filter(run__in=ids, kind=EventKind.CANCELLED)
    assert sorted(events.values_list("run", flat=True)) == sorted(cancelled)


def test_two_operators_replaying_the_same_dead_letters_replay_each_once():
    job = JobDefinitionFactory(name="bulk-replay-race")
    dead = [JobRunFactory(job=job, state=RunState.DEAD, payload={"value": i}) for i in range(10)]

    def replay_all(i: int) -> int:
        fresh = [services.replay_dead_letter(run.pk, by=f"admin:op{i}") for run in dead]
        return sum(run is not None for run in fresh)

    assert sum(race(3, replay_all)) == len(dead)
    for run in dead:
        assert JobRun.objects.filter(origin=run).count() == 1
        assert run.events.filter(kind=EventKind.REPLAYED).count() == 1

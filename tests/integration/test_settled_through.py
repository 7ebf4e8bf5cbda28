"""The settled-through mark: changes, outages and retention never repeat or drop an occurrence.

Time is injected: changes read cluster time through ``ledger.changes.cluster_now`` (patched), the
leader's catch-up takes ``now``; nodes' claims are written as the claim gate would.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from django_cluster_jobs import services
from django_cluster_jobs.coordination import Claim
from django_cluster_jobs.engine.catchup import catch_up as leader_catch_up
from django_cluster_jobs.engine.claimer import MISFIRE_GRACE
from django_cluster_jobs.ledger import changes, get_ledger
from django_cluster_jobs.models import (
    EventKind,
    JobDefinition,
    JobRun,
    Outcome,
    RunEvent,
    RunState,
)
from django_cluster_jobs.registry import registry
from django_cluster_jobs.schedules import occurrence_key
from tests.factories import JobDefinitionFactory, JobRunFactory

pytestmark = pytest.mark.django_db(transaction=True)

T = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
LEADER = SimpleNamespace(node_id="leader")


@pytest.fixture
def clock(monkeypatch):
    """Cluster time as definition changes read it; ``clock.at`` is moved by the test."""
    state = SimpleNamespace(at=T)
    monkeypatch.setattr(changes, "cluster_now", lambda using: state.at)
    return state


def catch_up(now: datetime) -> int:
    return leader_catch_up("default", registry.names(), LEADER.node_id, now)


def per_second(mark: datetime, **fields) -> JobDefinition:
    fields.setdefault("overlap", "skip")
    return JobDefinitionFactory(cron="* * * * * *", settled_through=mark, **fields)


def claimed(job: JobDefinition, first: datetime, last: datetime) -> None:
    """Rows as the nodes leave them: every second from ``first`` to ``last`` won and succeeded."""
    at = first
    while at <= last:
        JobRunFactory(job=job, key=occurrence_key(at), scheduled_at=at, outcome=Outcome.WON)
        at += SECOND


def rows(job: JobDefinition, *states: str) -> list[tuple[datetime, str, str]]:
    runs = JobRun.objects.filter(job=job).order_by("scheduled_at")
    if states:
        runs = runs.filter(state__in=states)
    return list(runs.values_list("scheduled_at", "state", "outcome"))


def mark(job: JobDefinition) -> datetime:
    return JobDefinition.objects.get(pk=job.pk).settled_through


# -- changes ---------------------------------------------------------------------------------


def test_a_new_job_is_settled_through_its_creation_in_cluster_time(clock):
    clock.at = T + timedelta(hours=3)
    job = JobDefinitionFactory(cron="* * * * *")
    assert mark(job) == T + timedelta(hours=3)
    catch_up(T + timedelta(hours=3, minutes=10))
    assert rows(job) and min(at for at, *_ in rows(job)) > T + timedelta(hours=3)


STOP_AND_START = {
    "pause": (lambda name: services.pause(name), lambda name: services.resume(name)),
    "disable": (
        lambda name: services.set_enabled([name], enabled=False),
        lambda name: services.set_enabled([name], enabled=True),
    ),
}


@pytest.mark.parametrize("change", STOP_AND_START)
def test_nothing_from_a_pause_is_run_or_recorded_and_the_first_occurrence_after_runs(clock, change):
    """8.1: pause (or disable) a per-second job for 30 s, resume it."""
    stop, start = STOP_AND_START[change]
    job = per_second(T - 20 * SECOND)
    claimed(job, T - 19 * SECOND, T)
    clock.at = T + timedelta(milliseconds=500)
    stop(job.name)
    assert mark(job) == clock.at
    catch_up(T + 30 * SECOND)  # leaders keep working during the pause
    clock.at = T + 30 * SECOND + timedelta(milliseconds=200)
    start(job.name)
    resumed = clock.at
    assert mark(job) == resumed
    claimed(job, T + 31 * SECOND, T + 50 * SECOND)  # the nodes fire again
    catch_up(T + 50 * SECOND)

    during = [r for r in rows(job) if T < r[0] <= resumed]
    assert during == [], "an occurrence of the pause was run or recorded"
    assert rows(job, RunState.MISSED, RunState.PENDING, RunState.SKIPPED) == []
    assert rows(job)[-20][0] == T + 31 * SECOND, "the first occurrence after the resume ran"


def test_an_unclaimed_backlog_before_a_pause_is_recorded_missed_naming_the_pause(clock):
    job = per_second(T - 3 * SECOND)  # the cluster is down: nothing claimed since
    clock.at = T + timedelta(milliseconds=300)
    services.pause(job.name)
    missed = JobRun.objects.filter(job=job, state=RunState.MISSED).order_by("scheduled_at")
    assert [r.scheduled_at for r in missed] == [T - 2 * SECOND, T - SECOND, T]
    assert {r.reason for r in missed} == {
        "not claimed before the job was paused; the misfire policy is skip"
    }
    assert not JobRun.objects.filter(job=job, outcome=Outcome.CATCH_UP).exists()


def test_an_unclaimed_backlog_before_a_resume_follows_the_misfire_policy(clock):
    job = per_second(T - 3 * SECOND, paused_until=T - timedelta(milliseconds=1500))
    clock.at = T + timedelta(milliseconds=300)
    services.resume(job.name)  # the pause had ended at T - 1.5 s, unseen by a leader
    assert rows(job) == [
        (T - SECOND, RunState.MISSED, Outcome.MISSED),
        (T, RunState.PENDING, Outcome.CATCH_UP),
    ]


def test_an_edited_schedule_never_catches_up_its_own_past(clock):
    """8.4: 09:00 daily becomes 08:00 daily at 08:30: today's 08:00 was never due."""
    day = datetime(2026, 5, 28, tzinfo=UTC)
    job = JobDefinitionFactory(cron="0 9 * * *", settled_through=day + timedelta(hours=8))
    JobRunFactory(job=job, key=occurrence_key(day - timedelta(hours=15)),
                  scheduled_at=day - timedelta(hours=15), outcome=Outcome.WON)  # fmt: skip
    clock.at = day + timedelta(hours=8, minutes=30)
    job.cron = "0 8 * * *"
    job.save()
    catch_up(day + timedelta(hours=8, minutes=45))
    assert rows(job) == [(day - timedelta(hours=15), RunState.SUCCEEDED, Outcome.WON)]
    assert mark(job) == day + timedelta(hours=8, minutes=45) - MISFIRE_GRACE - timedelta(
        seconds=0.5
    )


def test_saving_a_stale_copy_never_moves_the_mark_back(clock):
    job = per_second(T)
    stale = JobDefinition.objects.get(pk=job.pk)
    catch_up(T + 10 * SECOND)
    advanced = mark(job)
    assert advanced > T
    stale.priority = 5
    stale.save()  # not a change of what is due
    assert mark(job) == advanced


# -- outages and retention -------------------------------------------------------------------


def test_a_gap_is_settled_even_when_a_fresh_occurrence_was_claimed_before_the_leader_looked():
    """8.2: after a 30 s outage a node claims a fresh occurrence before the first catch-up."""
    job = per_second(T - 30 * SECOND, overlap="allow")
    JobRunFactory(job=job, key=occurrence_key(T - 30 * SECOND), scheduled_at=T - 30 * SECOND,
                  outcome=Outcome.WON)  # fmt: skip
    claimed(job, T, T + 10 * SECOND)  # the restarted nodes, before any leader looked
    catch_up(T + 10 * SECOND)
    gap = [r for r in rows(job) if T - 30 * SECOND < r[0] < T]
    assert [at for at, *_ in gap] == [T - 30 * SECOND + k * SECOND for k in range(1, 30)]
    assert [outcome for *_, outcome in gap].count(Outcome.CATCH_UP) == 1
    assert JobRun.objects.filter(job=job).count() == 41, "one row per occurrence"


def test_a_purged_claim_never_lets_its_occurrence_in_again(clock):
    """8.3: a monthly job ran on May 1, was run by hand on May 10; the May 1 row is purged."""
    may = datetime(2026, 5, 1, tzinfo=UTC)
    # Defined in December; the leader settled it month by month, through May 1 (the January to
    # April rows are long purged).
    clock.at = datetime(2025, 12, 1, tzinfo=UTC)
    job = JobDefinitionFactory(cron="0 0 1 * *", overlap="skip")
    JobDefinition.objects.filter(pk=job.pk).update(settled_through=may + timedelta(minutes=1))
    claimed_may = JobRunFactory(job=job, key=occurrence_key(may), scheduled_at=may,
                                outcome=Outcome.WON, finished_at=may)  # fmt: skip
    clock.at = may + timedelta(days=9)
    manual = services.trigger(job.name)
    JobRun.objects.filter(pk=manual.pk).update(state=RunState.SUCCEEDED, finished_at=clock.at)
    purged = get_ledger().chores.purge(may + timedelta(days=19), timedelta(days=14))
    assert purged == 1 and not JobRun.objects.filter(pk=claimed_may.pk).exists()

    claim = Claim(job.pk, occurrence_key(may), may, slot=True)
    now = may + timedelta(days=19)
    assert get_ledger().vendor.claim([claim], "late-node", now, now + 30 * SECOND) == []
    catch_up(now)  # a new leader
    assert list(JobRun.objects.filter(job=job).values_list("pk", flat=True)) == [manual.pk]


# -- the claim gate --------------------------------------------------------------------------


def test_claims_refuse_occurrences_at_or_before_the_mark(ledger):
    job = per_second(T, overlap="allow")
    lease = T + timedelta(minutes=1)
    slots = [Claim(job.pk, occurrence_key(at), at, slot=True) for at in (T - SECOND, T, T + SECOND)]
    won = ledger.vendor.claim(slots, "n1", T + 2 * SECOND, lease)
    assert [w.key for w in won] == [occurrence_key(T + SECOND)]
    keyed = Claim(job.pk, "external:invoice-9", T - SECOND)  # not an occurrence of the schedule
    assert [w.key for w in ledger.vendor.claim([keyed], "n1", T, lease)] == ["external:invoice-9"]


def test_a_claim_refused_by_the_mark_is_explained_by_the_gate(ledger):
    job = per_second(T, overlap="allow")
    gate = ledger.gates.gate_states({job.pk})[job.pk]
    assert gate.refusal(Claim(job.pk, "k", T, slot=True), T) == "settled"
    assert gate.refusal(Claim(job.pk, "k", T + SECOND, slot=True), T) is None
    JobDefinition.objects.filter(pk=job.pk).update(paused_until=T + 10 * SECOND)
    gate = ledger.gates.gate_states({job.pk})[job.pk]
    assert gate.refusal(Claim(job.pk, "k", T + SECOND, slot=True), T) == "paused"


# -- attribution -----------------------------------------------------------------------------


def test_a_miss_recorded_by_a_change_belongs_to_no_node(clock):
    job = per_second(T - 2 * SECOND)
    clock.at = T
    services.set_enabled([job.name], enabled=False)
    missed = JobRun.objects.filter(job=job, state=RunState.MISSED)
    assert set(missed.values_list("node", "fence")) == {("", 0)}
    kinds = RunEvent.objects.filter(run__in=missed).values_list("kind", flat=True)
    assert set(kinds) == {EventKind.MISSED}


# -- 8.9: a node whose clock is wrong never leads (SQLite) ------------------------------------


class Ticking:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.at = 100.0

    def __call__(self) -> float:
        return self.at


def test_a_wrong_clock_is_judged_only_over_a_window_every_live_node_heartbeats_in():
    """Two looks too close together see no heartbeat advance: that must not read as "no other
    node is live, so I may lead" (a node five minutes ahead led that way under load)."""
    from django_cluster_jobs.engine.clockcheck import ClockCheck
    from django_cluster_jobs.models import WorkerNode
    from tests.factories import WorkerNodeFactory

    interval = timedelta(seconds=5)
    for name in ("a", "b", "c"):
        WorkerNodeFactory(node_id=name, last_heartbeat=T)
    ticking = Ticking()
    check = ClockCheck("default", "ahead", monotonic=ticking)
    ahead = T + timedelta(minutes=5)
    assert check.verdict(ahead).waiting
    ticking.at += 0.2  # a second look before any of them heartbeat again
    assert check.verdict(ahead).refuses
    WorkerNode.objects.update(last_heartbeat=T + interval)
    ticking.at += 4.0  # still within one interval of the first look: nothing judged yet
    assert check.verdict(ahead + interval).refuses
    WorkerNode.objects.update(last_heartbeat=T + 2 * interval)
    ticking.at += 4.0
    verdict = check.verdict(ahead + 2 * interval)
    assert verdict.refuses and not verdict.waiting
    assert "its clock disagrees with a, whose last heartbeat" in verdict.reason


def test_a_clock_that_agrees_may_lead_once_the_others_are_seen_live():
    from django_cluster_jobs.engine.clockcheck import ClockCheck
    from django_cluster_jobs.models import WorkerNode
    from tests.factories import WorkerNodeFactory

    for name in ("a", "b"):
        WorkerNodeFactory(node_id=name, last_heartbeat=T)
    ticking = Ticking()
    check = ClockCheck("default", "me", monotonic=ticking)
    assert check.verdict(T).waiting
    WorkerNode.objects.update(last_heartbeat=T + timedelta(seconds=5))
    ticking.at += 8.0
    assert not check.verdict(T + timedelta(seconds=8)).refuses

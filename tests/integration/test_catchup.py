"""Catch-up by the leader: each misfire policy, the window, existing rows, the mark, races."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from django_cluster_jobs import signals
from django_cluster_jobs.conf import app_settings
from django_cluster_jobs.engine import catchup
from django_cluster_jobs.engine.catchup import horizon
from django_cluster_jobs.engine.claimer import MISFIRE_GRACE
from django_cluster_jobs.ledger import get_ledger, settle
from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    EventKind,
    JobDefinition,
    JobRun,
    NodeStatus,
    Outcome,
    RunEvent,
    RunState,
    ScheduleKind,
)
from django_cluster_jobs.policies import misfire
from django_cluster_jobs.registry import registry
from django_cluster_jobs.schedules import occurrence_key
from tests.factories import JobDefinitionFactory, JobRunFactory, WorkerNodeFactory
from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
LAST = datetime(2026, 5, 28, 8, 50, tzinfo=UTC)
#: The per-minute occurrences after LAST that no node fired by NOW (the horizon is 08:59:54.5).
GAP = [LAST + k * MINUTE for k in range(1, 10)]
MISSED = (RunState.MISSED, Outcome.MISSED)
CAUGHT_UP = (RunState.PENDING, Outcome.CATCH_UP)
LAST_RUN = (RunState.SUCCEEDED, Outcome.WON)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def fake_node(node_id: str | None = None) -> SimpleNamespace:
    """A leader for catch_up: its id; ``catch_up`` below passes what the leader passes."""
    return SimpleNamespace(node_id=node_id or f"leader-{uuid.uuid4().hex[:8]}")


def catch_up(node: SimpleNamespace, now: datetime) -> int:
    """Run the leader's catch-up as Leader.chores does, for every registered job."""
    return catchup.catch_up("default", registry.names(), node.node_id, now)


def minutely(kind: str = "cron", last: datetime | None = LAST, **fields) -> JobDefinition:
    """A per-minute job created at 08:45, settled through ``last`` where its latest run (won,
    succeeded) is; with ``last=None`` it never ran and is settled through its creation."""
    schedule = {"schedule_kind": ScheduleKind.CRON, "cron": "* * * * *"}
    if kind == "every":
        schedule = {"schedule_kind": ScheduleKind.EVERY, "cron": "", "interval": MINUTE}
    created = LAST - 5 * MINUTE
    job = JobDefinitionFactory(**schedule, **fields)
    JobDefinition.objects.filter(pk=job.pk).update(
        created_at=created, settled_through=last or created
    )
    if last is not None:
        won(job, last)
    return JobDefinition.objects.get(pk=job.pk)


def won(job: JobDefinition, when: datetime) -> JobRun:
    return JobRunFactory(job=job, key=occurrence_key(when), scheduled_at=when, outcome=Outcome.WON)


def ledger(job: JobDefinition) -> dict[datetime, tuple[str, str]]:
    runs = JobRun.objects.filter(job=job).order_by("scheduled_at")
    return {r.scheduled_at: (r.state, r.outcome) for r in runs}


def expect(job: JobDefinition, *, runs: list[datetime], missed: list[datetime], extra=()):
    """The ledger of ``job`` holds exactly its own rows plus these catch-up and missed rows."""
    rows = {when: MISSED for when in missed} | {when: CAUGHT_UP for when in runs}
    assert ledger(job) == {**dict(extra), **rows}


@pytest.mark.parametrize("kind", ["cron", "every"])
def test_fire_once_runs_the_latest_missed_occurrence_now_and_records_the_rest(kind):
    job = minutely(kind, overlap="skip")
    written = catch_up(fake_node(), NOW)

    assert written == len(GAP)
    expect(job, runs=GAP[-1:], missed=GAP[:-1], extra={LAST: LAST_RUN})
    run = JobRun.objects.get(job=job, outcome=Outcome.CATCH_UP)
    assert (run.key, run.due_at, run.lane) == ("2026-05-28T08:59:00Z", NOW, job.pk)
    assert "fire_once" in run.reason
    reasons = set(
        JobRun.objects.filter(job=job, state=RunState.MISSED).values_list("reason", flat=True)
    )
    assert reasons == {
        "no node fired it in time; fire_once runs only the latest missed occurrence "
        "(2026-05-28T08:59:00Z)"
    }


@pytest.mark.parametrize("kind", ["cron", "every"])
def test_skip_records_every_missed_occurrence_and_runs_none(kind):
    job = minutely(kind, misfire="skip")
    assert catch_up(fake_node(), NOW) == len(GAP)
    expect(job, runs=[], missed=GAP, extra={LAST: LAST_RUN})
    assert set(
        JobRun.objects.filter(job=job, state=RunState.MISSED).values_list("reason", flat=True)
    ) == {"no node fired it in time; the misfire policy is skip"}


@pytest.mark.parametrize("kind", ["cron", "every"])
def test_run_all_runs_the_latest_catch_up_limit_without_a_lane(kind):
    job = minutely(kind, misfire="run_all", catch_up_limit=3)
    assert catch_up(fake_node(), NOW) == len(GAP)
    expect(job, runs=GAP[-3:], missed=GAP[:-3], extra={LAST: LAST_RUN})
    runs = JobRun.objects.filter(job=job, outcome=Outcome.CATCH_UP).order_by("pk")
    assert [r.scheduled_at for r in runs] == GAP[-3:], "inserted, so taken, in due order"
    assert {(r.due_at, r.lane) for r in runs} == {(NOW, None)}


def test_run_all_with_a_limit_above_the_gap_runs_every_missed_occurrence():
    job = minutely("every", misfire="run_all", catch_up_limit=50)
    catch_up(fake_node(), NOW)
    expect(job, runs=GAP, missed=[], extra={LAST: LAST_RUN})


@pytest.mark.parametrize(
    ("misfire", "runs"),
    [("fire_once", GAP[-1:]), ("run_all", GAP[-5:]), ("skip", [])],
)
def test_the_window_bounds_what_runs_and_the_rest_is_recorded_missed(misfire, runs):
    job = minutely(misfire=misfire, catch_up_window=timedelta(minutes=5), catch_up_limit=10)
    catch_up(fake_node(), NOW)
    # 08:55 is exactly five minutes old: still inside; 08:51-08:54 are not.
    inside = [when for when in GAP if when >= NOW - timedelta(minutes=5)]
    assert inside[0] == at("2026-05-28T08:55")
    expect(job, runs=runs, missed=[w for w in GAP if w not in runs], extra={LAST: LAST_RUN})
    outside = JobRun.objects.filter(job=job, scheduled_at__lt=inside[0], state=RunState.MISSED)
    assert outside.count() == 4
    assert {r.reason for r in outside} == {
        "no node fired it in time; older than the catch-up window (0:05:00)"
    }


def test_a_window_shorter_than_the_delay_runs_nothing():
    job = minutely(catch_up_window=timedelta(seconds=30))
    assert catch_up(fake_node(), NOW) == len(GAP)
    expect(job, runs=[], missed=GAP, extra={LAST: LAST_RUN})


def test_existing_rows_are_respected_whatever_their_state():
    job = minutely()
    node = fake_node()
    assert catch_up(node, LAST) == 0  # this leader has now checked the job up to 08:50
    won(job, GAP[2])
    skipped = JobRunFactory(
        job=job,
        key=occurrence_key(GAP[8]),
        scheduled_at=GAP[8],
        state=RunState.SKIPPED,
        outcome=Outcome.WON,
        reason="overlap",
    )
    catch_up(node, NOW)
    missing = [w for w in GAP if w not in (GAP[2], GAP[8])]
    expect(
        job,
        runs=missing[-1:],
        missed=missing[:-1],
        extra={
            LAST: LAST_RUN,
            GAP[2]: (RunState.SUCCEEDED, Outcome.WON),
            GAP[8]: (RunState.SKIPPED, Outcome.WON),
        },
    )
    skipped.refresh_from_db()
    assert skipped.reason == "overlap"


def test_a_second_pass_writes_nothing_and_a_later_one_only_what_is_new():
    job = minutely(misfire="skip")
    node = fake_node()
    assert catch_up(node, NOW) == len(GAP)
    assert catch_up(node, NOW) == 0
    assert catch_up(fake_node(), NOW) == 0, "a new leader finds the same rows"
    assert catch_up(node, NOW + 3 * MINUTE) == 3
    later = [*GAP, NOW, NOW + MINUTE, NOW + 2 * MINUTE]
    expect(job, runs=[], missed=later, extra={LAST: LAST_RUN})


def test_a_job_that_never_ran_is_checked_from_its_creation():
    job = minutely(last=None)
    catch_up(fake_node(), NOW)
    since_created = [LAST - 5 * MINUTE + k * MINUTE for k in range(1, 15)]
    expect(job, runs=since_created[-1:], missed=since_created[:-1])


def test_a_new_leader_settles_from_the_mark_whatever_runs_were_made_since():
    # Nodes resumed before any leader looked (a database outage that also moved the lease): the
    # latest run alone would hide the gap before it; the mark does not.
    job = minutely("every", last=None, misfire="skip")
    JobDefinition.objects.filter(pk=job.pk).update(
        interval=timedelta(seconds=10), settled_through=at("2026-05-28T08:58:00")
    )
    won(job, at("2026-05-28T08:58:00"))
    won(job, at("2026-05-28T08:59:50"))
    catch_up(fake_node(), NOW)
    gap = [at("2026-05-28T08:58:00") + k * timedelta(seconds=10) for k in range(1, 11)]
    missed = JobRun.objects.filter(job=job, state=RunState.MISSED).order_by("scheduled_at")
    assert list(missed.values_list("scheduled_at", flat=True)) == gap


def test_occurrences_while_paused_or_disabled_are_not_misfires():
    paused = minutely(misfire="skip", paused_until=NOW + timedelta(hours=1))
    disabled = minutely(misfire="skip", enabled=False)
    node = fake_node()
    assert catch_up(node, NOW) == 0
    # A raw update bypasses save(), which would settle the job and move its mark; the leader
    # still moved the marks of the disabled and paused jobs past what was not due.
    JobDefinition.objects.filter(pk__in=(paused.pk, disabled.pk)).update(
        paused_until=None, enabled=True
    )
    assert catch_up(node, NOW + 2 * MINUTE) == 4
    for job in (paused, disabled):
        expect(job, runs=[], missed=[NOW, NOW + MINUTE], extra={LAST: LAST_RUN})


def test_only_fixed_instant_jobs_placed_once_in_the_cluster_are_caught_up():
    minutely(placement="every_node")
    for kind in (ScheduleKind.DELAY, ScheduleKind.STARTUP, ScheduleKind.ON_DEMAND):
        JobDefinitionFactory(schedule_kind=kind, cron="", interval=MINUTE)
    JobDefinition.objects.update(created_at=LAST)
    assert catch_up(fake_node(), NOW) == 0
    assert not JobRun.objects.exclude(outcome=Outcome.WON).exists()


def test_a_live_run_on_the_lane_turns_the_fire_once_catch_up_into_a_skip():
    job = minutely(overlap="skip")
    JobRunFactory(
        job=job,
        key="manual:live",
        scheduled_at=NOW,
        state=RunState.RUNNING,
        outcome=Outcome.MANUAL,
        lane=job.pk,
    )
    assert catch_up(fake_node(), NOW) == len(GAP)
    skipped = JobRun.objects.get(job=job, outcome=Outcome.CATCH_UP)
    assert (skipped.key, skipped.state, skipped.lane) == (
        "2026-05-28T08:59:00Z",
        RunState.SKIPPED,
        None,
    )
    assert "overlap" in skipped.reason


@pytest.fixture
def announced():
    """What catch-up sent: (signal name, sender, keyword arguments) in order."""
    sent: list[tuple[str, str, dict]] = []
    receivers = []
    for name in ("run_missed", "run_skipped"):

        def receiver(sender, _name=name, **kwargs):
            kwargs.pop("signal")
            sent.append((_name, sender, kwargs))

        getattr(signals, name).connect(receiver)
        receivers.append((getattr(signals, name), receiver))
    yield sent
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def test_each_missed_occurrence_is_announced_once_with_its_run(announced):
    job = minutely(misfire="skip")
    node = fake_node()
    catch_up(node, NOW)
    catch_up(node, NOW + timedelta(seconds=1))
    rows = JobRun.objects.filter(job=job, state=RunState.MISSED).order_by("scheduled_at")
    assert [(name, sender, kw["run_id"], kw["key"]) for name, sender, kw in announced] == [
        ("run_missed", job.name, r.pk, r.key) for r in rows
    ]
    assert {(kw["node"], kw["attempt"], kw["job"], kw["reason"]) for _, _, kw in announced} == {
        (node.node_id, 0, job.name, "no node fired it in time; the misfire policy is skip")
    }


def test_a_catch_up_refused_by_overlap_is_announced_skipped(announced):
    job = minutely(overlap="skip", misfire="fire_once", catch_up_window=timedelta(seconds=90))
    JobRunFactory(job=job, key="manual:live", scheduled_at=NOW, state=RunState.RUNNING,
                  outcome=Outcome.MANUAL, lane=job.pk)  # fmt: skip
    catch_up(fake_node(), NOW)
    skipped = JobRun.objects.get(job=job, state=RunState.SKIPPED)
    assert [(name, kw["run_id"]) for name, _, kw in announced if name == "run_skipped"] == [
        ("run_skipped", skipped.pk)
    ]
    assert "overlap" in announced[-1][2]["reason"]


def test_nothing_is_announced_when_the_pass_rolls_back(announced, monkeypatch):
    minutely(misfire="skip")

    def fail(*args, **kwargs):
        raise RuntimeError("the cluster event could not be written")

    monkeypatch.setattr(catchup, "_record", fail)
    with pytest.raises(RuntimeError):
        catch_up(fake_node(), NOW)
    assert announced == [] and not JobRun.objects.filter(state=RunState.MISSED).exists()


def test_a_gap_seen_in_two_passes_is_made_up_for_once_while_its_catch_up_is_queued():
    # The tail of an outage becomes visible one pass later; the catch-up still queued from the
    # first pass makes up for it too.
    job = minutely("every", last=None, overlap="allow")
    last = NOW - timedelta(seconds=30)
    JobDefinition.objects.filter(pk=job.pk).update(
        interval=timedelta(seconds=2), settled_through=last
    )
    won(job, last)
    node = fake_node()
    catch_up(node, NOW)
    first = JobRun.objects.get(job=job, outcome=Outcome.CATCH_UP)
    assert first.scheduled_at == at("2026-05-28T08:59:54")
    catch_up(node, NOW + timedelta(seconds=10))
    tail = JobRun.objects.filter(job=job, scheduled_at__gt=first.scheduled_at).order_by(
        "scheduled_at"
    )
    assert [(r.key, r.state) for r in tail] == [
        ("2026-05-28T08:59:56Z", RunState.MISSED),
        ("2026-05-28T08:59:58Z", RunState.MISSED),
        ("2026-05-28T09:00:00Z", RunState.MISSED),
        ("2026-05-28T09:00:02Z", RunState.MISSED),
        ("2026-05-28T09:00:04Z", RunState.MISSED),
    ]
    assert {r.reason for r in tail} == {
        "no node fired it in time; fire_once: the catch-up run 2026-05-28T08:59:54Z is already "
        "queued"
    }
    # Once it ran, the next misfire gets a catch-up of its own.
    JobRun.objects.filter(pk=first.pk).update(state=RunState.SUCCEEDED)
    catch_up(node, NOW + timedelta(seconds=14))
    assert JobRun.objects.get(job=job, state=RunState.PENDING).key == "2026-05-28T09:00:08Z"


def test_the_horizon_reaches_back_to_the_start_of_the_earliest_live_node():
    grace = NOW - MISFIRE_GRACE - timedelta(seconds=app_settings.HEARTBEAT_INTERVAL)
    assert horizon("default", NOW, "me") == grace
    beat = {"last_heartbeat": NOW}
    WorkerNodeFactory(started_at=NOW - timedelta(hours=1), status=NodeStatus.DEAD, **beat)
    WorkerNodeFactory(started_at=NOW - timedelta(hours=1), status=NodeStatus.STOPPED, **beat)
    WorkerNodeFactory(started_at=NOW - timedelta(seconds=2), **beat)
    assert horizon("default", NOW, "me") == NOW - timedelta(seconds=2)
    WorkerNodeFactory(started_at=NOW - timedelta(minutes=1), status=NodeStatus.DRAINING, **beat)
    assert horizon("default", NOW, "me") == grace


def test_a_leader_ahead_of_the_other_nodes_never_settles_their_future():
    """8.9: the horizon is never later than the others' latest heartbeat minus the grace."""
    others = NOW - timedelta(minutes=5)  # the other nodes' clocks: this leader is 5 min ahead
    WorkerNodeFactory(started_at=others - timedelta(hours=1), last_heartbeat=others)
    WorkerNodeFactory(node_id="me", started_at=NOW - timedelta(hours=1), last_heartbeat=NOW)
    assert horizon("default", NOW, "me") == others - MISFIRE_GRACE
    job = minutely(misfire="skip", last=others - 3 * MINUTE)
    catch_up(SimpleNamespace(node_id="me"), NOW)
    job.refresh_from_db()
    assert job.settled_through == others - MISFIRE_GRACE
    assert not JobRun.objects.filter(job=job, scheduled_at__gt=others - MISFIRE_GRACE).exists()


def test_a_freshly_started_cluster_is_settled_in_one_pass():
    job = minutely("every", last=None, misfire="run_all", catch_up_limit=2, overlap="allow")
    last = NOW - timedelta(seconds=10)
    JobDefinition.objects.filter(pk=job.pk).update(
        interval=timedelta(seconds=1), settled_through=last
    )
    won(job, last)
    WorkerNodeFactory(started_at=NOW - timedelta(milliseconds=300))
    catch_up(fake_node(), NOW)
    rows = JobRun.objects.filter(job=job).exclude(outcome=Outcome.WON).order_by("scheduled_at")
    assert [r.key for r in rows][-2:] == ["2026-05-28T08:59:58Z", "2026-05-28T08:59:59Z"]
    assert [r.state for r in rows] == [RunState.MISSED] * 7 + [RunState.PENDING] * 2


def test_missed_rows_per_pass_are_bounded(monkeypatch, caplog):
    monkeypatch.setattr(misfire, "MISSED_ROWS_LIMIT", 5)
    monkeypatch.setattr(settle, "SCAN_LIMIT", 7)
    job = minutely(misfire="skip")
    log = logging.getLogger(catchup.__name__)
    log.addHandler(caplog.handler)
    try:
        assert catch_up(fake_node(), NOW) == 5
    finally:
        log.removeHandler(caplog.handler)
    expect(job, runs=[], missed=GAP[-5:], extra={LAST: LAST_RUN})
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("2 more missed occurrence(s) not recorded" in m for m in warnings)
    assert any("those before 2026-05-28T08:53:00Z were settled" in m for m in warnings)
    job.refresh_from_db()
    assert job.settled_through == NOW - MISFIRE_GRACE - timedelta(
        seconds=app_settings.HEARTBEAT_INTERVAL
    ), "settled through the horizon, older occurrences included"


def test_concurrent_leaders_write_one_row_per_missed_occurrence(announced):
    jobs = [
        minutely(overlap="skip"),
        minutely(misfire="run_all", catch_up_limit=3, overlap="skip"),
        minutely(misfire="skip"),
    ]
    nodes = [fake_node(f"racer-{i}-{uuid.uuid4().hex[:6]}") for i in range(3)]
    results = race(3, lambda i: catch_up(nodes[i], NOW))
    assert len(results) == 3 and sum(results) >= 3 * len(GAP)
    expect(jobs[0], runs=GAP[-1:], missed=GAP[:-1], extra={LAST: LAST_RUN})
    expect(jobs[1], runs=GAP[-3:], missed=GAP[:-3], extra={LAST: LAST_RUN})
    expect(jobs[2], runs=[], missed=GAP, extra={LAST: LAST_RUN})
    keys = Counter((sender, kw["key"]) for name, sender, kw in announced if name == "run_missed")
    missed = JobRun.objects.filter(state=RunState.MISSED).values_list("job__name", "key")
    assert sorted(keys) == sorted(missed) and set(keys.values()) == {1}, "announced twice"


def test_each_settling_pass_leaves_one_cluster_event_and_missed_rows_belong_to_no_node():
    once, skip = minutely(overlap="skip"), minutely(misfire="skip")
    node = fake_node()
    catch_up(node, NOW)
    catch_up(node, NOW)
    event = ClusterEvent.objects.get(kind=ClusterEventKind.CAUGHT_UP)
    assert (event.at, event.node) == (NOW, node.node_id)
    assert event.detail == (
        f"{once.name}: 1 catch-up run(s) queued, 8 recorded missed, 0 skipped; "
        f"{skip.name}: 0 catch-up run(s) queued, 9 recorded missed, 0 skipped"
    )
    # 8.5: a miss belongs to no node and no fence; its timeline names the leader that decided.
    missed = JobRun.objects.filter(state=RunState.MISSED)
    assert set(missed.values_list("node", "fence", "finished_at", "created_at")) == {
        ("", 0, NOW, NOW)
    }
    assert set(RunEvent.objects.filter(run__in=missed).values_list("kind", "node", "at")) == {
        (EventKind.MISSED, node.node_id, NOW)
    }
    assert RunEvent.objects.filter(run__in=missed).count() == missed.count()
    pending = JobRun.objects.get(state=RunState.PENDING)
    assert (pending.node, pending.finished_at, pending.due_at) == ("", None, NOW)


def test_pending_catch_ups_wake_the_nodes(monkeypatch):
    minutely()
    node = fake_node()
    woken = []
    vendor = type(get_ledger().vendor)
    monkeypatch.setattr(vendor, "notify_pending", lambda self: woken.append(True))
    catch_up(node, NOW)
    assert woken == [True]
    catch_up(node, NOW)
    assert woken == [True]


def test_a_leader_without_a_jobs_tags_still_settles_its_misses():
    """The leader covers every job of the cluster, not only those its own tags let it run."""
    from django_cluster_jobs.engine import Node

    minutely(requires=["gpu"])
    leader = Node("untagged-leader", tags=frozenset(), threads=1)
    leader.register()
    leader.reload()
    try:
        assert not any(p.definition.requires for p in leader.planned.values())
        assert catchup.catch_up("default", leader.registry.names(), leader.node_id, NOW) > 0
    finally:
        leader.executor.shutdown()

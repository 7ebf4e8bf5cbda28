"""Failure policies with an injected clock: retries, dead letters, breaker, timeouts, signals."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections

from django_cluster_jobs import services, signals
from django_cluster_jobs.engine.planner import load_planned
from django_cluster_jobs.engine.registration import sync_definitions
from django_cluster_jobs.engine.runner import Runner, Stop
from django_cluster_jobs.ledger import get_ledger
from django_cluster_jobs.models import (
    ClusterEvent,
    EventKind,
    JobDefinition,
    JobRun,
    PauseCause,
    RunState,
)
from django_cluster_jobs.policies.retry import Backoff
from django_cluster_jobs.registry import registry
from tests import timing
from tests.clocks import FixedClock
from tests.conftest import database_url, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
#: The grace period of the thread-timeout test: a thread past its deadline gets this long to
#: return before its run is concluded without it.
GRACE = timing.scaled(0.3)


@pytest.fixture
def env(request):
    """A runner with a fixed clock, the definitions synced, and every signal recorded."""
    sync_definitions(registry, "default")
    planned = load_planned("default", registry)
    clock = FixedClock(T0)
    runner = Runner(get_ledger(), clock, "n1")
    sent = defaultdict(list)
    receivers = []
    for name in (
        "run_started",
        "run_succeeded",
        "run_failed",
        "run_retried",
        "run_dead_lettered",
        "run_skipped",
        "run_lost",
    ):

        def receiver(sender, _name=name, **kwargs):
            kwargs.pop("signal")
            sent[_name].append({"sender": sender, **kwargs})

        getattr(signals, name).connect(receiver)
        receivers.append((getattr(signals, name), receiver))
    yield runner, clock, planned, sent
    for signal, receiver in receivers:
        signal.disconnect(receiver)


def run_then_close(runner: Runner, won, p) -> None:
    try:
        runner.run(won, p, T0, {})
    finally:
        connections.close_all()


def take(runner: Runner, clock: FixedClock, planned: dict, name: str):
    """Take the one due pending run of ``name`` and run it in this thread."""
    p = planned[name]
    [won] = runner.ledger.vendor.take_pending(
        "n1", [p.definition.pk], 1, clock.now(), clock.now() + timedelta(seconds=30)
    )
    runner.run(won, p, won.scheduled_at, won.payload)
    return JobRun.objects.get(pk=won.run_id)


def test_backoff_policies():
    assert Backoff("fixed", base=7).delay(5) == timedelta(seconds=7)
    exp = Backoff("exponential", base=2, factor=3, cap=50)
    assert [exp.delay(n).total_seconds() for n in (1, 2, 3, 4)] == [2, 6, 18, 50]
    jitter = Backoff("exponential_jitter", base=10, cap=100)
    assert jitter.delay(3, random.Random(1)) == timedelta(seconds=random.Random(1).uniform(0, 40))


def test_a_retry_sequence_has_exact_backoff_then_dead_letters(env):
    runner, clock, planned, sent = env
    run = services.enqueue("tests.flaky", at=T0)
    first = take(runner, clock, planned, "tests.flaky")
    assert (first.state, first.attempt, first.due_at) == ("pending", 2, T0 + timedelta(seconds=10))
    clock.at = T0 + timedelta(seconds=10)
    second = take(runner, clock, planned, "tests.flaky")
    assert (second.attempt, second.due_at) == (3, T0 + timedelta(seconds=25))  # 10 + min(20, 15)
    clock.at = T0 + timedelta(seconds=25)
    third = take(runner, clock, planned, "tests.flaky")
    assert (third.state, third.attempt, third.pk) == (RunState.DEAD, 3, run.pk)
    failures = run.events.filter(kind=EventKind.FAILED)
    assert failures.count() == 2 and "Traceback" in failures.first().reason
    assert [e.kind for e in run.events.all()].count(EventKind.RETRIED) == 2
    assert [s["will_retry"] for s in sent["run_failed"]] == [True, True, False]
    assert [s["due_at"] for s in sent["run_retried"]] == [
        T0 + timedelta(seconds=10),
        T0 + timedelta(seconds=25),
    ]
    assert len(sent["run_dead_lettered"]) == 1 and len(sent["run_started"]) == 3
    assert set(sent["run_dead_lettered"][0]) == {
        "sender",
        "job",
        "run_id",
        "key",
        "node",
        "attempt",
        "error",
    }


def test_replay_runs_a_dead_letter_again_as_a_linked_fresh_run(env):
    runner, clock, planned, sent = env
    dead = services.enqueue("tests.flaky", {"succeed_on": 1}, at=T0)
    JobRun.objects.filter(pk=dead.pk).update(state=RunState.DEAD, attempt=3)
    fresh = services.replay(JobRun.objects.get(pk=dead.pk), by="operator")
    assert (fresh.origin_id, fresh.state, fresh.outcome) == (dead.pk, "pending", "replay")
    assert dead.events.get().kind == EventKind.REPLAYED
    clock.at = datetime.now(UTC) + timedelta(seconds=1)  # replays are due at once, in real time
    done = take(runner, clock, planned, "tests.flaky")
    assert (done.pk, done.state, done.result) == (fresh.pk, RunState.SUCCEEDED, 1)
    assert [s["result"] for s in sent["run_succeeded"]] == [1]


def test_exceptions_listed_in_dont_retry_are_never_retried(env):
    runner, clock, planned, sent = env
    services.enqueue("tests.no_retry", at=T0)
    run = take(runner, clock, planned, "tests.no_retry")
    assert (run.state, run.attempt) == (RunState.DEAD, 1)
    assert run.error == "ValueError: bad input is never retried"
    assert sent["run_retried"] == []


def test_the_breaker_opens_after_consecutive_failures_and_resumes(env):
    runner, clock, planned, _sent = env
    for _ in range(2):
        services.enqueue("tests.breaker", at=T0)
        take(runner, clock, planned, "tests.breaker")
    job = JobDefinition.objects.get(name="tests.breaker")
    assert job.paused_until == T0 + timedelta(minutes=1)
    assert "2 consecutive failed runs" in job.pause_reason
    assert job.pause_cause == PauseCause.BREAKER
    assert list(JobDefinition.objects.breaker_open(T0).values_list("name", flat=True)) == [
        "tests.breaker"
    ]
    assert ClusterEvent.objects.filter(kind="breaker_opened").count() == 1
    from django_cluster_jobs.coordination import Claim

    claim = Claim(job.pk, "k", T0)
    assert runner.ledger.vendor.claim([claim], "n1", T0, T0 + timedelta(seconds=9)) == []
    services.resume("tests.breaker")
    assert JobDefinition.objects.get(name="tests.breaker").pause_cause == PauseCause.NONE
    assert len(runner.ledger.vendor.claim([claim], "n1", T0, T0 + timedelta(seconds=9))) == 1
    services.pause("tests.breaker", reason="circuit breaker: typed by an operator")
    assert JobDefinition.objects.get(name="tests.breaker").pause_cause == PauseCause.OPERATOR
    assert not JobDefinition.objects.breaker_open(T0).exists()


def test_a_success_in_between_keeps_the_breaker_closed(env):
    runner, clock, planned, _ = env
    services.enqueue("tests.breaker", at=T0)
    take(runner, clock, planned, "tests.breaker")
    ok = services.enqueue("tests.manual", at=T0)
    JobRun.objects.filter(pk=ok.pk).update(
        job=JobDefinition.objects.get(name="tests.breaker"),
        state=RunState.SUCCEEDED,
        finished_at=T0,
    )
    services.enqueue("tests.breaker", at=T0)
    take(runner, clock, planned, "tests.breaker")
    assert JobDefinition.objects.get(name="tests.breaker").paused_until is None


@pytest.mark.timing  # its 0.3 s deadline must pass before its 5 s wait does
def test_a_timed_out_thread_run_is_flagged_cancelled_and_ends_timed_out(env):
    runner, clock, planned, sent = env
    services.enqueue("tests.polite", at=T0)
    run = take(runner, clock, planned, "tests.polite")
    assert run.state == RunState.TIMED_OUT and run.error.startswith("TimeoutError")
    assert sent["run_failed"][0]["state"] == RunState.TIMED_OUT


def deaf_until(p, returns: threading.Event):
    """``p`` with a handler that ignores its cancel flag and returns only once ``returns`` is set
    (a thread cannot be killed)."""

    def deaf(ctx) -> None:
        returns.wait(timing.PROCESS_LIFE)

    return dataclasses.replace(p, job=dataclasses.replace(p.job, func=deaf))


@pytest.mark.timing
def test_a_thread_ignoring_its_timeout_is_concluded_after_the_grace_period(env, settings):
    settings.CLUSTER_JOBS = {**settings.CLUSTER_JOBS, "GRACE_PERIOD": GRACE}
    runner, _clock, planned, _ = env
    services.enqueue("tests.stubborn", at=T0)
    returns = threading.Event()
    p = deaf_until(planned["tests.stubborn"], returns)
    [won] = runner.ledger.vendor.take_pending("n1", [p.definition.pk], 1, T0, T0 + timedelta(60))
    worker = threading.Thread(target=run_then_close, args=(runner, won, p), daemon=True)
    worker.start()
    try:
        # Its handler cannot return before ``returns`` is set: the run ends without it.
        limit = p.definition.timeout.total_seconds() + GRACE + timing.REACT
        wait_until(lambda: JobRun.objects.get(pk=won.run_id).state == RunState.TIMED_OUT, limit)
    finally:
        returns.set()
        worker.join(timing.RUN_ENDS)
    assert not worker.is_alive()
    run = JobRun.objects.get(pk=won.run_id)  # the handler's late return changed nothing
    assert run.state == RunState.TIMED_OUT and "after its deadline plus the grace" in run.error
    assert not run.events.filter(kind="fenced_out").exists()


@pytest.mark.timing
def test_the_process_executor_kills_a_hung_handler_at_its_deadline(env, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", database_url())
    runner, clock, planned, _ = env
    services.enqueue("tests.hang", at=T0)
    limit = planned["tests.hang"].definition.timeout.total_seconds()
    started = time.monotonic()
    run = take(runner, clock, planned, "tests.hang")
    assert run.state == RunState.TIMED_OUT and f"killed after {limit}s" in run.error
    # at its deadline, not when its minute of sleep ends: a poll, a kill and a write later
    assert time.monotonic() - started < limit + timing.REACT


@pytest.mark.timing
def test_a_cancel_request_ends_the_run_cancelled(env):
    runner, _clock, planned, _ = env
    pending = services.enqueue("tests.cancellable", at=T0)
    p = planned["tests.cancellable"]
    [won] = runner.ledger.vendor.take_pending("n1", [p.definition.pk], 1, T0, T0 + timedelta(60))
    worker = threading.Thread(target=run_then_close, args=(runner, won, p), daemon=True)
    worker.start()
    wait_until(lambda: won.run_id in runner.running, timing.REACT)
    assert services.request_cancel(JobRun.objects.get(pk=pending.pk))
    runner.cancel({won.run_id}, why=Stop.CANCEL)  # what the node's heartbeat does on seeing it
    worker.join(timing.REACT)  # its handler waits on its cancel flag
    run = JobRun.objects.get(pk=pending.pk)
    assert run.state == RunState.CANCELLED
    kinds = set(run.events.values_list("kind", flat=True))
    assert {EventKind.CANCEL_REQUESTED, EventKind.CANCELLED} <= kinds


def test_losing_an_at_most_once_run_sends_run_lost_once(env):
    from django_cluster_jobs.coordination import Won

    runner, _clock, planned, sent = env
    run = services.enqueue("tests.long_once", at=T0)
    p = planned["tests.long_once"]
    [won] = runner.ledger.vendor.take_pending("n1", [p.definition.pk], 1, T0, T0 + timedelta(60))
    runner.ledger.runs.hand_back(won, "n1", T0)
    runner.ledger.runs.hand_back(Won(won.run_id, won.job_id, won.key, won.fence), "n1", T0)
    assert [(s["run_id"], s["sender"]) for s in sent["run_lost"]] == [(run.pk, "tests.long_once")]


def test_a_buffered_run_goes_before_a_new_occurrence_once_its_predecessor_ended(ledger):
    """The predecessor ended but was not released yet (or its node died): the new occurrence
    must yield to the buffered run instead of starting beside it."""
    from django_cluster_jobs.coordination import Claim, Refusal
    from django_cluster_jobs.models import PARKED
    from django_cluster_jobs.policies.overlap import Gate
    from tests.factories import JobDefinitionFactory, JobRunFactory

    job = JobDefinitionFactory(overlap="buffer_one")
    JobRunFactory(job=job, key="a", state=RunState.SUCCEEDED)  # ended, not released
    parked = JobRunFactory(job=job, key="b", state=RunState.PENDING, due_at=PARKED)
    gate, clock = Gate("buffer_one", 1), FixedClock(T0)
    result = ledger.gates.claim_gated(
        Claim(job.pk, "c", T0), gate, "n1", clock.now, timedelta(seconds=30)
    )
    assert (result.won, result.refusal) == (None, Refusal.OVERLAP)
    assert result.reason == "overlap: the buffered run goes first"
    assert JobRun.objects.get(pk=parked.pk).due_at == T0
    assert not JobRun.objects.filter(job=job, key="c", state=RunState.RUNNING).exists()


def test_run_skipped_is_sent_once_per_occurrence_however_many_nodes_skip_it(env):
    from django_cluster_jobs.coordination import Claim
    from django_cluster_jobs.engine import Node

    _, _, planned, sent = env
    p = planned["tests.every_second"]
    claim = Claim(p.definition.pk, "2026-05-28T09:00:01Z", T0 + timedelta(seconds=1))
    nodes = [Node(f"n{i}", threads=1) for i in range(3)]
    try:
        why = "overlap: the previous run is still live"
        for node in nodes:  # three nodes find the same occurrence refused by overlap
            node.claimer._record_skip(p, claim, T0, why, "overlap")
    finally:
        for node in nodes:
            node.executor.shutdown()
    [skipped] = sent["run_skipped"]
    assert skipped["sender"] == "tests.every_second" and skipped["key"] == claim.key
    assert skipped["reason"] == "overlap: the previous run is still live"
    assert JobRun.objects.filter(key=claim.key, state=RunState.SKIPPED).count() == 1


def test_a_breaker_without_a_cooldown_opens_for_five_minutes_and_the_run_concludes(env):
    """8.11: a database job may set breaker_threshold alone; the breaker still opens."""
    from tests.factories import JobDefinitionFactory

    runner, clock, planned, _sent = env
    job = JobDefinitionFactory(
        name="db-breaker", callable_name="tests.breaker", schedule_kind="delay", cron="",
        interval=timedelta(seconds=30), breaker_threshold=2, breaker_cooldown=None,
        overlap="buffer_one",
    )  # fmt: skip
    planned = load_planned("default", registry)
    done = []
    for _ in range(2):
        services.enqueue("db-breaker", at=T0)
        p = planned["db-breaker"]
        [won] = runner.ledger.vendor.take_pending(
            "n1", [job.pk], 1, clock.now(), clock.now() + timedelta(seconds=30)
        )
        runner.run(won, p, won.scheduled_at, won.payload, on_done=done.append)
    job.refresh_from_db()
    assert job.paused_until == T0 + timedelta(minutes=5)
    assert done == [T0, T0], "the fixed-delay job was planned again after each run"

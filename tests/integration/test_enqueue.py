"""One-off runs: idempotent enqueue under races, payload checks, transactions, priority with aging,
and how an idle node comes to start what was enqueued (woken, or at its poll)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_cluster_jobs import InvalidPayload, UnknownJob, registry, services
from django_cluster_jobs.conf import app_settings
from django_cluster_jobs.coordination import get_vendor
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from django_cluster_jobs.ranks import rank_of
from tests import timing
from tests.conftest import ROOT, database_url, wait_until
from tests.factories import JobDefinitionFactory, JobRunFactory, WorkerNodeFactory
from tests.races import race
from tests.timing import arg, scaled

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
LEASE = NOW + timedelta(seconds=30)
RACERS = 8
#: A child process sets Django up, enqueues one run and exits (a hang guard).
CHILD_ENDS = scaled(60)
#: A killed child process is reaped.
CHILD_REAPED = scaled(10)
#: The life of a scheduler of the start tests: past its start and every round of a test, and
#: within the watchdog's PROCESS_LIFE.
SCHEDULER_LIFE = arg(100)
#: A poll interval (times the scale, tests/settings.py) so much longer than REACT that a run
#: started within REACT was announced to the node, not found by a poll.
NEVER_POLLS = "600"


def in_other_connection(query):
    """Run ``query`` on a fresh connection of another thread and return what it returned."""
    return race(1, lambda _: query())[0]


def count_runs(**lookups) -> int:
    return in_other_connection(lambda: JobRun.objects.filter(**lookups).count())


# -- idempotency under concurrent callers ----------------------------------------------------


def test_concurrent_threads_with_one_key_get_one_run():
    ids = race(RACERS, lambda _: services.enqueue("tests.manual", {"value": 1}, key="same").pk)
    assert len(ids) == RACERS and len(set(ids)) == 1
    assert JobRun.objects.filter(job__name="tests.manual").count() == 1
    assert JobRun.objects.get().key == "enqueued:same"


ENQUEUE_IN_CHILD = """
import sys
import django

django.setup()
from django.db import connection
from django_cluster_jobs import services

connection.ensure_connection()
print("ready", flush=True)
sys.stdin.readline()
print(services.enqueue("tests.manual", {"value": 2}, key="same").pk, flush=True)
"""


def test_concurrent_processes_with_one_key_get_one_run():
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ENQUEUE_IN_CHILD],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for proc in procs:  # every child is set up and connected before any enqueues
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=CHILD_ENDS)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=CHILD_REAPED)
    assert [proc.returncode for proc in procs] == [0] * 4
    ids = {int(out.split()[-1]) for out in outputs}
    assert len(ids) == 1
    assert list(JobRun.objects.values_list("pk", flat=True)) == list(ids)


# -- the payload is checked at the call ------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [{"value": object()}, {"when": NOW}, {1: "not a keyword"}, {"x": float("nan")}, ["value"]],
    ids=["object", "datetime", "int-key", "nan", "not-a-dict"],
)
def test_a_payload_that_is_not_json_is_refused_naming_the_job(payload):
    with pytest.raises(InvalidPayload, match=r"'tests\.manual'") as caught:
        services.enqueue("tests.manual", payload)
    assert caught.value.job == "tests.manual"
    assert not JobRun.objects.exists()


def test_the_job_shortcut_checks_the_payload_too():
    with pytest.raises(InvalidPayload, match=r"tests\.manual.*not JSON-serialisable"):
        registry.get("tests.manual").enqueue(value={1, 2})
    run = registry.get("tests.manual").enqueue(value=[1, {"a": None}])
    assert (run.state, run.payload) == (RunState.PENDING, {"value": [1, {"a": None}]})


# -- cluster time ----------------------------------------------------------------------------


@pytest.mark.parametrize("registered", [True, False], ids=["stored job", "first enqueue"])
def test_a_caller_whose_clock_is_wrong_still_enqueues_a_run_due_now(monkeypatch, registered):
    """Due times are cluster time (the database's clock), not the calling process's."""
    if registered:
        services.definition_for("tests.manual")
    WorkerNodeFactory()  # a node has run, so the database's clock is readable
    wrong = datetime.now(UTC) + timedelta(hours=1)
    monkeypatch.setattr(timezone, "now", lambda: wrong)
    before = datetime.now(UTC)
    run = services.enqueue("tests.manual")
    after = datetime.now(UTC)
    stored = JobRun.objects.get(pk=run.pk)
    margin = timedelta(seconds=2)  # the database's clock against this machine's, on one machine
    assert before - margin <= stored.due_at <= after + margin, stored.due_at
    assert stored.created_at == stored.due_at == run.due_at


def test_replay_is_due_on_the_database_clock(monkeypatch):
    WorkerNodeFactory()
    original = JobRunFactory(job=services.definition_for("tests.manual"), state=RunState.DEAD)
    monkeypatch.setattr(timezone, "now", lambda: datetime.now(UTC) + timedelta(hours=1))
    fresh = services.replay(original)
    assert abs(JobRun.objects.get(pk=fresh.pk).due_at - datetime.now(UTC)) < timedelta(seconds=2)


# -- transactions ----------------------------------------------------------------------------


def test_a_run_enqueued_in_a_transaction_appears_only_at_commit():
    with transaction.atomic():
        run = services.enqueue("tests.manual", {"value": 3})
        assert count_runs(pk=run.pk) == 0  # another connection cannot see it yet
    assert count_runs(pk=run.pk) == 1


def test_a_rolled_back_transaction_takes_its_run_with_it():
    with pytest.raises(RuntimeError), transaction.atomic():
        services.enqueue("tests.manual", {"value": 4}, key="rolled-back")
        raise RuntimeError("the view failed")
    assert not JobRun.objects.exists()


def test_enqueue_deferred_with_on_commit_runs_after_the_commit():
    with transaction.atomic():
        transaction.on_commit(lambda: registry.get("tests.manual").enqueue(value=5))
        assert not JobRun.objects.exists()
    assert list(JobRun.objects.values_list("payload", flat=True)) == [{"value": 5}]


def test_enqueue_deferred_with_on_commit_never_runs_after_a_rollback():
    with pytest.raises(RuntimeError), transaction.atomic():
        transaction.on_commit(lambda: registry.get("tests.manual").enqueue(value=6))
        raise RuntimeError("the view failed")
    assert not JobRun.objects.exists()


#: The channel of the marker a listener sends itself (tests only).
MARKER = "cluster_jobs_test_marker"


def announced_before_marker(listener) -> list[str]:
    """The channels notified to ``listener`` before a marker it sends itself now.

    PostgreSQL delivers notifications in the order their transactions committed, so this lists
    every notification committed before now, and none of a transaction still open: no window of
    time to wait out."""
    listener.execute(f"NOTIFY {MARKER}")
    channels = []
    for note in listener.notifies(timeout=timing.SERVER_ANSWERS):
        if note.channel == MARKER:
            return channels
        channels.append(note.channel)
    pytest.fail(f"the marker notification did not come back within {timing.SERVER_ANSWERS:g} s")


@pytest.mark.postgresql
def test_the_notification_is_sent_on_commit_and_never_on_rollback():
    from django_cluster_jobs.coordination.postgresql import PENDING_CHANNEL

    if app_settings.COORDINATION == "orm":
        pytest.skip("the portable ORM path sends no notifications")
    listener = connection.get_new_connection(connection.get_connection_params())
    try:
        listener.autocommit = True
        listener.execute(f"LISTEN {PENDING_CHANNEL}")
        listener.execute(f"LISTEN {MARKER}")
        with pytest.raises(RuntimeError), transaction.atomic():
            services.enqueue("tests.manual", {"value": 7})
            raise RuntimeError("rolled back")
        assert announced_before_marker(listener) == []
        with transaction.atomic():
            services.enqueue("tests.manual", {"value": 8})
            assert announced_before_marker(listener) == []
        assert announced_before_marker(listener) == [PENDING_CHANNEL]
    finally:
        listener.close()


# -- priority order with aging ---------------------------------------------------------------


def pending(job, priority: int, overdue: float, **extra) -> JobRun:
    due = NOW - timedelta(seconds=overdue)
    return JobRunFactory(
        job=job, state=RunState.PENDING, priority=priority, due_at=due, scheduled_at=due, **extra
    )


def take_one_by_one(ledger, job_ids: list[int], now: datetime = NOW) -> list[int]:
    order = []
    while taken := ledger.vendor.take_pending("n", job_ids, 1, now, LEASE):
        order.append(taken[0].run_id)
    return order


def test_pending_runs_are_taken_by_priority_with_aging(ledger):
    job, other = JobDefinitionFactory(), JobDefinitionFactory()
    # rank = priority + seconds overdue / 60 (the default PRIORITY_AGING)
    fresh_high = pending(job, 10, 0)  # 10
    old_low = pending(job, 0, 600)  # 10, due earlier than fresh_high: wins the tie
    old_low_later_id = pending(other, 0, 600)  # 10, same due time: the lower id wins
    middle = pending(job, 5, 120)  # 7
    recent_middle = pending(other, 5, 1)  # 5.02
    pending(job, 99, -60)  # not due yet: never taken now
    expected = [old_low, old_low_later_id, fresh_high, middle, recent_middle]

    assert take_one_by_one(ledger, [job.pk, other.pk]) == [r.pk for r in expected]
    assert JobRun.objects.filter(state=RunState.PENDING).count() == 1


def test_one_call_returns_the_runs_it_took_in_rank_order(ledger):
    job = JobDefinitionFactory()
    runs = [pending(job, 3, 0), pending(job, 0, 400), pending(job, 1, 0), pending(job, 2, 90)]
    taken = ledger.vendor.take_pending("n", [job.pk], 3, NOW, LEASE)
    assert [w.run_id for w in taken] == [runs[1].pk, runs[3].pk, runs[0].pk]  # 6.7, 3.5, 3


@pytest.mark.parametrize(
    ("overdue", "first"),
    [(0, "high"), (179, "high"), (180, "low"), (181, "low"), (3600, "low")],
)
def test_an_old_low_priority_run_beats_a_fresh_high_one_once_aged_enough(ledger, overdue, first):
    job = JobDefinitionFactory()
    high = pending(job, 3, 0)
    low = pending(job, 0, overdue)  # three points behind: level after 180 s, ahead after
    [taken] = ledger.vendor.take_pending("n", [job.pk], 1, NOW, LEASE)
    assert taken.run_id == {"high": high, "low": low}[first].pk


def test_the_aging_setting_scales_the_wait_per_point(ledger):
    job = JobDefinitionFactory()
    high, low = pending(job, 3, 0), pending(job, 0, 40)
    with override_settings(CLUSTER_JOBS={**settings.CLUSTER_JOBS, "PRIORITY_AGING": 10}):
        assert take_one_by_one(ledger, [job.pk]) == [low.pk, high.pk]


@pytest.mark.parametrize("off", [None, 0])
def test_without_aging_priority_is_strict(ledger, off):
    job = JobDefinitionFactory()
    runs = [pending(job, 0, 86_400), pending(job, 1, 0), pending(job, 1, 60)]
    with override_settings(CLUSTER_JOBS={**settings.CLUSTER_JOBS, "PRIORITY_AGING": off}):
        assert take_one_by_one(ledger, [job.pk]) == [runs[2].pk, runs[1].pk, runs[0].pk]


def test_sub_second_due_times_rank_and_tie_exactly(ledger):
    job = JobDefinitionFactory()
    high = pending(job, 1, 0.5)  # 1 + 0.5/60
    level = pending(job, 0, 60.5)  # 60.5/60: the same rank, due earlier, so first
    earlier, later = pending(job, 0, 0.5), pending(job, 0, 0.25)
    expected = [level, high, earlier, later]
    assert take_one_by_one(ledger, [job.pk]) == [r.pk for r in expected]


# -- how an idle node comes to start an enqueued run -----------------------------------------


def wait_started(scheduler, *, listens: bool = True) -> None:
    """Wait until the node has started and, where it ``listens`` (PostgreSQL's LISTEN), until
    it does: from then on, every run enqueued is announced to it."""
    wait_until(scheduler.started, timeout=timing.NODE_START)
    if listens and connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            listening = (
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
            )
            wait_until(lambda: cursor.execute(listening) or cursor.fetchone()[0],
                       timeout=timing.REACT)  # fmt: skip


def start_latencies(scheduler, rounds: int) -> list[float]:
    """Enqueue ``rounds`` runs, each once the one before has ended, so that the node is idle;
    wait for each to start within REACT; return each one's started_at - created_at."""
    latencies = []
    for i in range(rounds):
        run = services.enqueue("tests.manual", {"value": i})
        started = wait_until(
            lambda run=run: JobRun.objects.filter(pk=run.pk, started_at__isnull=False).first(),
            timeout=timing.REACT,
            interval=0.01,
        )
        latencies.append((started.started_at - started.created_at).total_seconds())
        ended = JobRun.objects.filter(pk=run.pk, state=RunState.SUCCEEDED)
        wait_until(ended.exists, timeout=timing.RUN_ENDS)
    assert scheduler.proc.poll() is None, scheduler.output()
    return latencies


@pytest.mark.timing
def test_an_idle_node_is_woken_not_polled(start_scheduler):
    """PostgreSQL's NOTIFY, or on SQLite the wake file, brings the run to an idle node: with a
    poll interval far longer than REACT (and on SQLite a safety poll ten times that), every run
    that starts within REACT was announced. The first round may be found by the node's first
    look; each later one finds the node idle, with nothing but the announcement to wake it."""
    if get_vendor().features.listens is False and get_vendor().wake_path() is None:
        pytest.skip("the portable ORM path polls: nothing announces a run")
    scheduler = start_scheduler(
        "listener", "--duration", SCHEDULER_LIFE, CLUSTER_JOBS_TEST_POLL=NEVER_POLLS
    )
    wait_started(scheduler)
    latencies = start_latencies(scheduler, rounds=4)
    print("wake-up enqueue-to-start latencies (ms):", [round(s * 1000, 1) for s in latencies])


def test_a_failed_wake_signal_is_logged_and_the_enqueue_stands(caplog, monkeypatch):
    from django_cluster_jobs.coordination import wakefile

    if get_vendor().wake_path() is None:
        pytest.skip("this database announces runs without a wake file, or not at all")

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(wakefile, "signal", refuse)
    with caplog.at_level(logging.WARNING, logger="django_cluster_jobs.coordination.sqlite"):
        run = services.enqueue("tests.manual", {"value": 1})
    assert JobRun.objects.filter(pk=run.pk, state=RunState.PENDING).exists()
    assert "could not wake the idle nodes" in caplog.text and "Permission denied" in caplog.text


@pytest.mark.timing
def test_an_idle_node_that_hears_nothing_starts_an_enqueued_run_at_its_poll(start_scheduler):
    """On the portable ORM path nothing announces a run: the node looks every POLL_INTERVAL
    (1 s, scaled), and each run starts within REACT, which allows one poll interval. End to
    end only: REACT would let a slower poll pass; tests/unit/test_taker.py pins the poll's due
    time to exactly one POLL_INTERVAL after a look that found nothing."""
    scheduler = start_scheduler(
        "poller", "--duration", SCHEDULER_LIFE, CLUSTER_JOBS_COORDINATION="orm"
    )
    wait_started(scheduler, listens=False)
    latencies = start_latencies(scheduler, rounds=3)
    print("enqueue-to-start latencies (ms):", [round(s * 1000, 1) for s in latencies])


def test_job_enqueue_takes_an_idempotency_key_and_a_priority():
    from django_cluster_jobs.registry import registry

    manual = registry.get("tests.manual")
    first = manual.enqueue(value=1, idempotency_key="order-7", priority=9)
    again = manual.enqueue(value=2, idempotency_key="order-7")
    assert again.pk == first.pk and (first.payload, first.priority) == ({"value": 1}, 9)
    later = manual.enqueue_at(first.due_at + timedelta(hours=1), value=3)
    assert later.pk != first.pk and later.due_at == first.due_at + timedelta(hours=1)


def statements_of(call) -> list[str]:
    """The statements ``call()`` sends on this thread's connection."""
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        call()
    return sent


def test_an_enqueue_without_a_key_is_one_statement_with_its_notification():
    """The INSERT reads the definition row itself and, on PostgreSQL, sends the notification:
    one round trip per call once the job's handler is known to the process."""
    services.enqueue("tests.manual", {"value": 0})  # the first call looks the handler up
    sent = statements_of(lambda: services.enqueue("tests.manual", {"value": 1}))
    if not get_vendor().features.inserts_pending:  # the portable path: a read and an INSERT
        assert [sql.split(None, 1)[0].upper() for sql in sent] == ["SELECT", "INSERT"], sent
        return
    assert len(sent) == 1, sent
    assert ("pg_notify" in sent[0]) == (connection.vendor == "postgresql"), sent
    run = JobRun.objects.get(payload={"value": 1})
    assert (run.state, run.job.name, run.priority) == (RunState.PENDING, "tests.manual", 0)
    assert run.pending_rank == rank_of(run.due_at, run.priority)
    assert run.created_at == run.due_at == run.scheduled_at


def test_an_enqueue_uses_the_definition_as_stored_at_that_instant():
    """No copy of the definition is kept between calls: a priority changed a moment ago is the
    next run's default, and the rank follows it."""
    services.enqueue("tests.manual", {"value": 0})
    JobDefinition.objects.filter(name="tests.manual").update(priority=7)
    run = services.enqueue("tests.manual", {"value": 1})
    stored = JobRun.objects.get(pk=run.pk)
    assert run.priority == stored.priority == 7
    assert stored.pending_rank == rank_of(stored.due_at, 7)
    assert services.enqueue("tests.manual", priority=-3).priority == -3


def test_a_deleted_job_is_refused_right_after_its_deletion():
    """A job that exists only in the database (no code declares its name) and was enqueued a
    moment ago: once its row is deleted, the next enqueue stores nothing and says why."""
    JobDefinitionFactory(name="adhoc", schedule_kind="on_demand", cron="")
    services.enqueue("adhoc", {"value": 1})
    JobDefinition.objects.filter(name="adhoc").delete()
    with pytest.raises(UnknownJob, match=r"'adhoc'"):
        services.enqueue("adhoc", {"value": 2})
    assert not JobRun.objects.exists()


def test_a_job_whose_handler_changed_is_checked_against_the_new_one():
    """The payload is checked against the handler the definition names when the run is stored:
    a definition pointed at another handler since the last call is read again first."""
    JobDefinitionFactory(name="adhoc", schedule_kind="on_demand", cron="")
    services.enqueue("adhoc", {"value": 1})  # tests.manual takes a value
    JobDefinition.objects.filter(name="adhoc").update(callable_name="tests.boom")
    with pytest.raises(InvalidPayload, match=r"'adhoc'"):
        services.enqueue("adhoc", {"value": 2})  # tests.boom takes none
    assert JobRun.objects.count() == 1
    assert services.enqueue("adhoc").job.callable_name == "tests.boom"


def test_a_disabled_job_still_takes_one_off_runs_at_once():
    """Disabling stops a job's schedule, not its on-demand runs (docs/howto/admin.md): the
    enqueue right after the change stores a run, as it did before it."""
    services.enqueue("tests.manual", {"value": 1})
    services.set_enabled(["tests.manual"], enabled=False)
    run = services.enqueue("tests.manual", {"value": 2})
    assert JobRun.objects.get(pk=run.pk).state == RunState.PENDING


def test_a_repeated_key_with_another_payload_is_warned_about(caplog):
    caplog.set_level(logging.WARNING, logger="django_cluster_jobs.services")
    first = services.enqueue("tests.manual", {"value": 1}, key="order-8")
    assert services.enqueue("tests.manual", {"value": 1}, key="order-8").pk == first.pk
    assert not caplog.records, "the same payload again is the normal idempotent case"
    assert services.enqueue("tests.manual", {"value": 2}, key="order-8").pk == first.pk
    [record] = caplog.records
    assert "tests.manual" in record.message and "'order-8'" in record.message
    assert JobRun.objects.get(pk=first.pk).payload == {"value": 1}

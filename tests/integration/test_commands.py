"""``runjob`` (one occurrence in the foreground, claimed once) and ``schedulerstatus``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from django_cluster_jobs.conf import app_settings
from django_cluster_jobs.engine.oneshot import OneShot
from django_cluster_jobs.models import JobDefinition, JobRun, Outcome, RunState
from tests import timing
from tests.conftest import ROOT, database_url
from tests.factories import JobDefinitionFactory, JobRunFactory, LeaseFactory, WorkerNodeFactory
from tests.models import Effect
from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
#: A management command in a fresh interpreter: it starts Django (as a starting node does) and
#: runs one short occurrence, or reports.
COMMAND_ENDS = timing.NODE_START + timing.RUN_ENDS


def runjob(*args: str) -> str:
    out = io.StringIO()
    call_command("runjob", *args, stdout=out, verbosity=0)
    return out.getvalue()


def manage(*args: str, timeout: float = COMMAND_ENDS, **extra: str) -> subprocess.CompletedProcess:
    """Run ``python -m django ARGS`` on the test database, as a pod or a CronJob would."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        **extra,
    }
    cmd = [sys.executable, "-m", "django", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def every_second():
    """A database-defined per-second cron job running the registered tests.manual, defined (so
    settled through) a day before the occurrences these tests claim."""
    return JobDefinitionFactory(
        name="ticker",
        cron="* * * * * *",
        callable_name="tests.manual",
        settled_through=T0 - timedelta(days=1),
    )


# -- runjob: once per occurrence -------------------------------------------------------------


def test_runjob_twice_for_the_same_occurrence_runs_it_once():
    first = runjob("tests.manual", "--at", "2026-05-28T09:00:00.3Z", "--node-id", "cron-1")
    second = runjob("tests.manual", "--at", "2026-05-28T11:00:00.2+02:00", "--node-id", "cron-2")

    run = JobRun.objects.get()
    assert (run.key, run.outcome, run.state) == (
        "external:2026-05-28T09:00:00Z",
        Outcome.EXTERNAL,
        RunState.SUCCEEDED,
    )
    assert first.strip() == (
        f"run {run.pk} of tests.manual @ external:2026-05-28T09:00:00Z on cron-1: succeeded"
    )
    assert f"not run, already claimed by run {run.pk} on cron-1 (succeeded)" in second
    assert list(Effect.objects.values_list("key", "node")) == [(run.key, "cron-1")]


def test_the_arrival_is_snapped_to_the_nearest_occurrence(every_second):
    runjob("ticker", "--at", "2026-05-28T09:00:00.4Z")
    run = JobRun.objects.get()
    assert (run.key, run.scheduled_at) == ("2026-05-28T09:00:00Z", T0)
    assert "already claimed" in runjob("ticker", "--at", "2026-05-28T08:59:59.6Z")
    runjob("ticker", "--at", "2026-05-28T09:00:00.6Z")
    keys = list(JobRun.objects.order_by("scheduled_at").values_list("key", flat=True))
    assert keys == ["2026-05-28T09:00:00Z", "2026-05-28T09:00:01Z"]
    assert Effect.objects.count() == 2


def test_a_cron_job_snaps_to_its_nearest_fire_time_in_either_direction():
    JobDefinitionFactory(name="five", cron="*/5 * * * *", callable_name="tests.manual")
    shot = OneShot("five")
    assert shot.occurrence(T0 + timedelta(minutes=2, seconds=29)) == (T0, "2026-05-28T09:00:00Z")
    later = T0 + timedelta(minutes=5)
    assert shot.occurrence(T0 + timedelta(minutes=2, seconds=31)) == (
        later,
        "2026-05-28T09:05:00Z",
    )


def test_a_key_makes_its_own_claim():
    runjob("tests.manual", "--key", "invoice-7")
    assert "already claimed" in runjob("tests.manual", "--key", "invoice-7")
    assert list(JobRun.objects.values_list("key", flat=True)) == ["external:invoice-7"]


def test_the_same_occurrence_from_two_processes_at_once_runs_once(every_second):
    args = ["runjob", "ticker", "--at", "2026-05-28T09:00:00.2Z", "-v", "0"]
    nodes = ("pod-a", "pod-b")
    # a hang guard past each command's own deadline, so that a slow command says so itself
    deadline = COMMAND_ENDS + timing.REACT
    results = race(2, lambda i: manage(*args, "--node-id", nodes[i]), deadline=deadline)
    assert [r.returncode for r in results] == [0, 0], results
    outputs = sorted(r.stdout for r in results)
    assert sum("succeeded" in o and "already claimed" not in o for o in outputs) == 1, outputs
    assert sum("already claimed" in o for o in outputs) == 1, outputs
    run = JobRun.objects.get()
    assert run.key == "2026-05-28T09:00:00Z" and run.node in ("pod-a", "pod-b")
    assert list(Effect.objects.values_list("node", flat=True)) == [run.node]


# -- runjob: outcomes and exit status --------------------------------------------------------


def test_a_failing_job_exits_1_and_records_the_failure():
    done = manage("runjob", "tests.boom", "--node-id", "cron-1", "-v", "0")
    run = JobRun.objects.get()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"run {run.pk} of tests.boom" in done.stderr and "RuntimeError: boom" in done.stderr
    assert (run.state, run.node, run.outcome) == (RunState.FAILED, "cron-1", Outcome.EXTERNAL)
    assert "RuntimeError: boom" in run.traceback


def test_a_failing_job_raises_with_returncode_1_in_process():
    with pytest.raises(CommandError, match="failed") as caught:
        runjob("tests.boom")
    assert caught.value.returncode == 1
    assert JobRun.objects.get().state == RunState.FAILED


def test_the_payload_reaches_the_handler_and_the_result_is_kept():
    runjob("tests.manual", "--payload", '{"value": 21}')
    run = JobRun.objects.get()
    assert (run.payload, run.result, run.state) == ({"value": 21}, 42, RunState.SUCCEEDED)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("{value: 1}", "argument --payload: not valid JSON"),
        ("[1, 2]", "argument --payload: must be a JSON object of keyword arguments, not a list"),
        ('"text"', "not a str"),
    ],
)
def test_a_payload_that_is_not_a_json_object_is_refused(payload, message):
    with pytest.raises(CommandError, match=message):
        runjob("tests.manual", "--payload", payload)
    assert not JobRun.objects.exists()


@pytest.mark.parametrize(
    ("at", "message"),
    [("2026-05-28T09:00:00", "has no UTC offset"), ("tomorrow", "is not an ISO-8601 time")],
)
def test_at_must_be_an_aware_iso_time(at, message):
    with pytest.raises(CommandError, match=message):
        runjob("tests.manual", "--at", at)


def test_an_unknown_job_lists_the_registered_ones(every_second):
    with pytest.raises(CommandError, match="No job named 'nope'") as caught:
        runjob("nope")
    assert "tests.manual" in str(caught.value) and "ticker" in str(caught.value)


def test_a_disabled_job_is_not_run_and_exits_0(every_second):
    JobDefinition.objects.filter(pk=every_second.pk).update(enabled=False)
    out = runjob("ticker", "--at", "2026-05-28T09:00:00Z")
    assert "not run, the job is disabled" in out
    assert not JobRun.objects.exists()


GATES = {
    "buffer_one": ({"overlap": "buffer_one"}, "buffered: a node runs it as soon as"),
    "max_concurrency": (
        {"overlap": "allow", "max_concurrency": 1},
        "not claimed: max_concurrency 1 reached",
    ),
    "queue": ({"overlap": "allow", "queue": "limited"}, "not claimed: queue 'limited' limit 2"),
}


@pytest.mark.parametrize("gate", GATES)
def test_runjob_claims_through_the_same_gates_as_the_scheduler(gate):
    """8.6: an external trigger respects overlap, concurrency and queue limits."""
    fields, expected = GATES[gate]
    job = JobDefinitionFactory(
        name="gated", cron="* * * * * *", callable_name="tests.manual",
        settled_through=T0 - timedelta(days=1), **fields,
    )  # fmt: skip
    busy = 2 if gate == "queue" else 1
    for n in range(busy):
        live = job if gate != "queue" else JobDefinitionFactory(name=f"q{n}", queue="limited")
        JobRunFactory(job=live, key=f"live-{n}", state=RunState.RUNNING, node="elsewhere",
                      lease_expires_at=timezone.now() + timedelta(minutes=1))  # fmt: skip
    out = runjob("gated", "--at", "2026-05-28T09:00:00Z")
    assert expected in out, out
    assert not Effect.objects.exists(), "ran beside the live run"
    row = JobRun.objects.get(job=job, key="2026-05-28T09:00:00Z")
    assert row.state == (RunState.PENDING if gate == "buffer_one" else RunState.SKIPPED)


def test_runjob_with_cancel_other_cancels_the_live_run_then_runs():
    job = JobDefinitionFactory(
        name="newest", cron="* * * * * *", callable_name="tests.manual",
        overlap="cancel_other", settled_through=T0 - timedelta(days=1),
    )  # fmt: skip
    live = JobRunFactory(job=job, key="live", state=RunState.RUNNING, node="elsewhere",
                         lease_expires_at=timezone.now() + timedelta(minutes=1))  # fmt: skip
    out = runjob("newest", "--at", "2026-05-28T09:00:00Z")
    assert ": succeeded" in out
    live.refresh_from_db()
    assert live.cancel_requested and Effect.objects.count() == 1


@pytest.mark.timing
def test_the_lease_is_renewed_while_the_handler_runs(monkeypatch):
    beat = app_settings.HEARTBEAT_INTERVAL  # the lease keeper renews once per heartbeat
    monkeypatch.setenv("CLUSTER_JOBS_TEST_LONG", f"{4 * beat / timing.SCALE:g}")  # jobs.py scales
    seen: set = set()
    stop = threading.Event()

    def watch() -> None:
        from django.db import connections

        try:
            while not stop.wait(beat / 5):
                run = JobRun.objects.filter(job__name="tests.long").first()
                if run is not None and run.lease_expires_at is not None:
                    seen.add(run.lease_expires_at)
        finally:
            connections.close_all()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = OneShot("tests.long", node_id="cron-1").run()
    finally:
        stop.set()
        watcher.join(timeout=timing.REACT)
    assert result.ok and result.ended == RunState.SUCCEEDED
    assert len(seen) >= 2, "the lease was never renewed"


# -- schedulerstatus -------------------------------------------------------------------------


@pytest.fixture
def cluster():
    now = timezone.now()
    WorkerNodeFactory(node_id="node-a", last_heartbeat=now, clock_offset_ms=1.5)
    WorkerNodeFactory(node_id="node-b", last_heartbeat=now - timedelta(hours=1), status="dead")
    LeaseFactory(
        name="leader",
        holder="node-a",
        token="t",
        fence=3,
        acquired_at=now,
        expires_at=now + timedelta(minutes=1),
    )
    nightly = JobDefinitionFactory(name="nightly", cron="0 3 * * *", source="code")
    JobRunFactory(job=nightly, state=RunState.SUCCEEDED, scheduled_at=now - timedelta(days=1))
    JobRunFactory(
        job=nightly,
        state=RunState.FAILED,
        scheduled_at=now - timedelta(hours=1),
        finished_at=now - timedelta(hours=1),
        node="node-b",
        error="RuntimeError: disk full\nmore detail",
    )
    JobDefinitionFactory(name="adhoc", schedule_kind="on_demand", cron="", enabled=False)
    return nightly


def status(*args: str) -> str:
    out = io.StringIO()
    call_command("schedulerstatus", *args, stdout=out)
    return out.getvalue()


def test_schedulerstatus_text_names_the_nodes_the_leader_and_the_jobs(cluster):
    text = status()
    for expected in ("node-a", "node-b", "nightly", "adhoc", "Leader: node-a", "(fence 3)"):
        assert expected in text
    assert "At 03:00 (UTC)" in text  # cron-descriptor's reading
    assert "disk full" in text and "more detail" not in text
    assert "Nodes: 2 (healthy" in text and "[disabled]" in text


TOP_KEYS = {
    "generated_at",
    "healthy",
    "dead_after_seconds",
    "nodes",
    "leader",
    "jobs",
    "recent_failures",
    "unreadable",
}
NODE_KEYS = {
    "node_id",
    "host",
    "pid",
    "version",
    "tags",
    "status",
    "started_at",
    "last_heartbeat",
    "heartbeat_age_seconds",
    "running_runs",
    "clock_offset_ms",
    "claims_won",
    "claims_lost",
    "skipped",
}
JOB_KEYS = {
    "name",
    "callable",
    "source",
    "schedule",
    "description",
    "enabled",
    "paused",
    "paused_until",
    "pause_reason",
    "next_fire_time",
    "last_run",
    "last_success",
    "last_failure",
    "problems",
}
RUN_KEYS = {"id", "key", "state", "scheduled_at", "started_at", "finished_at", "node", "error"}


def test_schedulerstatus_json_has_the_documented_keys(cluster):
    report = json.loads(status("--json"))
    assert set(report) == TOP_KEYS and report["healthy"] is True
    assert [set(n) for n in report["nodes"]] == [NODE_KEYS, NODE_KEYS]
    assert report["leader"]["holder"] == "node-a" and report["leader"]["fence"] == 3
    jobs = {job["name"]: job for job in report["jobs"]}
    assert set(jobs) == {"nightly", "adhoc"} and all(set(j) == JOB_KEYS for j in jobs.values())
    nightly = jobs["nightly"]
    assert nightly["schedule"] == {
        "kind": "cron",
        "cron": "0 3 * * *",
        "timezone": "UTC",
        "interval_seconds": None,
    }
    assert nightly["next_fire_time"].endswith("T03:00:00.000Z")
    assert (
        set(nightly["last_success"]) == RUN_KEYS and nightly["last_success"]["state"] == "succeeded"
    )
    assert nightly["last_run"] == nightly["last_failure"]
    assert nightly["last_failure"]["error"] == "RuntimeError: disk full"
    assert jobs["adhoc"]["next_fire_time"] is None and jobs["adhoc"]["last_run"] is None
    [failure] = report["recent_failures"]
    assert set(failure) == RUN_KEYS | {"job"} and failure["job"] == "nightly"
    assert datetime.fromisoformat(report["generated_at"]).tzinfo is not None


def test_schedulerstatus_check_passes_while_an_active_node_heartbeats(cluster):
    status("--check")  # no error


def test_schedulerstatus_check_fails_without_a_recent_heartbeat(cluster):
    from django_cluster_jobs.models import WorkerNode

    dead_after = app_settings.DEAD_AFTER
    WorkerNode.objects.filter(node_id="node-a").update(
        last_heartbeat=timezone.now() - timedelta(seconds=2 * dead_after)
    )
    expected = f"no active node heartbeated within {dead_after:g} s"
    with pytest.raises(CommandError, match=expected) as caught:
        status("--check")
    assert caught.value.returncode == 1
    assert "NOT HEALTHY" in status()


def test_schedulerstatus_check_exit_codes_from_the_command_line(cluster):
    from django_cluster_jobs.models import WorkerNode

    # The fixture's heartbeats do not move: a command that takes longer than the suite's
    # DEAD_AFTER to start (a loaded host) must still find them recent, so its DEAD_AFTER is as
    # long as a command may take (given unscaled: the settings scale it); five times it is not.
    slow_start = {"CLUSTER_JOBS_DEAD_AFTER": f"{COMMAND_ENDS / timing.SCALE:g}"}
    assert manage("schedulerstatus", "--check", "--json", **slow_start).returncode == 0
    stale = timedelta(seconds=5 * COMMAND_ENDS)
    WorkerNode.objects.update(last_heartbeat=timezone.now() - stale)
    done = manage("schedulerstatus", "--check", **slow_start)
    assert done.returncode == 1 and "no active node heartbeated" in done.stderr
    assert "node-a" in done.stdout


def test_schedulerstatus_on_an_empty_cluster():
    report = json.loads(status("--json"))
    assert report["nodes"] == [] and report["leader"] is None and report["healthy"] is False

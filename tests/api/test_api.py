"""The REST API: every endpoint with and without permission, filters, validation, and actions that
go through the services (so they leave the same ledger rows the admin and the scheduler do)."""

from __future__ import annotations

import importlib
import sys
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from django_cluster_jobs import services
from django_cluster_jobs.models import (
    EventKind,
    JobDefinition,
    JobRun,
    NodeStatus,
    Outcome,
    RunEvent,
    RunState,
    ScheduleKind,
    WorkerNode,
)
from django_cluster_jobs.status import build_status
from tests.api_fixtures import MANAGE, TRACEBACK, TRIGGER, VIEW_ALL, at, parse, url
from tests.factories import (
    JobDefinitionFactory,
    JobRunFactory,
    LeaseFactory,
    WorkerNodeFactory,
)

pytestmark = pytest.mark.django_db


# -- permissions --------------------------------------------------------------------------------

READS = [
    ("job-list", (), "view_jobdefinition"),
    ("job-detail", ("report",), "view_jobdefinition"),
    ("run-list", (), "view_jobrun"),
    ("node-list", (), "view_workernode"),
    ("node-detail", ("node-a",), "view_workernode"),
    ("leader", (), "view_lease"),
]


@pytest.mark.parametrize(("name", "args", "perm"), READS)
def test_reads_need_the_models_view_permission(cluster, user_with, name, args, perm):
    assert APIClient().get(url(name, *args)).status_code in (401, 403)
    others = [codename for codename in VIEW_ALL if codename != perm]
    assert user_with(*others, TRIGGER, MANAGE).get(url(name, *args)).status_code == 403
    assert user_with(perm).get(url(name, *args)).status_code == 200


def test_run_detail_needs_view_jobrun(cluster, user_with):
    path = url("run-detail", cluster["failed"].pk)
    assert APIClient().get(path).status_code in (401, 403)
    assert user_with("view_jobdefinition").get(path).status_code == 403
    assert user_with("view_jobrun").get(path).status_code == 200


@pytest.mark.parametrize(("name", "args"), [("job-list", ()), ("job-detail", ("report",))])
def test_a_jobs_last_runs_follow_the_run_permissions(cluster, user_with, name, args):
    """A viewer of jobs who may not view runs gets no run through the jobs endpoints: a run's
    error, node and key are run data."""

    def last_runs(client) -> list[object]:
        answer = client.get(url(name, *args)).json()
        [job] = answer if isinstance(answer, list) else [answer]
        return [job["last_run"], job["last_success"], job["last_failure"]]

    assert last_runs(user_with("view_jobdefinition")) == [None, None, None]
    shown = last_runs(user_with("view_jobdefinition", "view_jobrun"))
    assert [run["id"] for run in shown] == [cluster["running"].pk, cluster["ok"].pk,
                                            cluster["failed"].pk]  # fmt: skip
    assert shown[2]["error"] == "RuntimeError: boom"


def test_change_permission_counts_as_view_as_in_the_admin(cluster, user_with):
    assert user_with("change_jobrun").get(url("run-list")).status_code == 200


def test_status_needs_view_permission_on_everything_it_shows(cluster, user_with):
    assert APIClient().get(url("status")).status_code in (401, 403)
    for missing in VIEW_ALL:
        others = [codename for codename in VIEW_ALL if codename != missing]
        assert user_with(*others).get(url("status")).status_code == 403, missing
    assert user_with(*VIEW_ALL).get(url("status")).status_code == 200


#: (url name, what it acts on in ``cluster``, the permission it needs, its success status)
ACTIONS = [
    ("job-trigger", "job", TRIGGER, 201),
    ("job-enqueue", "job", TRIGGER, 201),
    ("run-replay", "failed", TRIGGER, 201),
    ("job-pause", "job", MANAGE, 200),
    ("job-resume", "job", MANAGE, 200),
    ("run-cancel", "running", MANAGE, 202),
    ("node-drain", "node_a", MANAGE, 202),
]


def nothing_changed(runs: int) -> bool:
    return (
        JobRun.objects.count() == runs
        and JobDefinition.objects.get(name="report").paused_until is None
        and not JobRun.objects.filter(cancel_requested=True).exists()
        and not WorkerNode.objects.filter(node_id="node-a", status=NodeStatus.DRAINING).exists()
    )


@pytest.mark.parametrize(("name", "target", "perm", "success"), ACTIONS)
def test_each_action_needs_its_permission(cluster, user_with, name, target, perm, success):
    path = url(name, {"job": "report", "node_a": "node-a"}.get(target) or cluster[target].pk)
    other = MANAGE if perm == TRIGGER else TRIGGER
    runs = JobRun.objects.count()
    assert APIClient().post(path, {}, format="json").status_code in (401, 403)
    assert user_with(*VIEW_ALL).post(path, {}, format="json").status_code == 403
    assert user_with(*VIEW_ALL, other).post(path, {}, format="json").status_code == 403
    assert nothing_changed(runs)
    assert user_with(perm).post(path, {}, format="json").status_code == success


def test_writes_without_an_action_are_refused_even_to_superusers(cluster):
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("root"))
    assert client.delete(url("run-detail", cluster["ok"].pk)).status_code == 405
    assert client.put(url("job-detail", "report"), {}, format="json").status_code == 405
    assert JobRun.objects.filter(pk=cluster["ok"].pk).exists()


def test_importing_without_rest_framework_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rest_framework", None)
    for module in [m for m in sys.modules if m.startswith("django_cluster_jobs.api")]:
        monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ImportError, match=r"django-cluster-jobs\[api\]"):
        importlib.import_module("django_cluster_jobs.api.urls")


# -- jobs ---------------------------------------------------------------------------------------


def test_job_list_shows_definition_schedule_and_last_runs(cluster, viewer):
    [job] = viewer.get(url("job-list")).json()
    assert job["name"] == "report"
    assert job["callable_name"] == "tests.manual"
    assert (job["schedule_kind"], job["cron"], job["timezone"]) == ("cron", "0 9 * * *",
                                                                     "Europe/Paris")  # fmt: skip
    assert job["description"] == "At 09:00 (Europe/Paris)"
    assert (job["enabled"], job["paused"], job["paused_until"], job["pause_reason"]) == (
        True, False, None, ""
    )  # fmt: skip
    assert job["last_run"]["id"] == cluster["running"].pk
    assert job["last_success"]["id"] == cluster["ok"].pk
    assert job["last_failure"] == {
        "id": cluster["failed"].pk, "key": "k2", "state": "failed", "outcome": "catch_up",
        "scheduled_at": job["last_failure"]["scheduled_at"],
        "started_at": job["last_failure"]["started_at"],
        "finished_at": job["last_failure"]["finished_at"], "node": "node-b",
        "error": "RuntimeError: boom",
    }  # fmt: skip
    nine = parse(job["next_fire_time"]).astimezone(cluster["job"].get_schedule()._zone)
    assert (nine.hour, nine.minute) == (9, 0) and parse(job["next_fire_time"]) > timezone.now()
    assert "next_fire_times" not in job


def test_job_list_takes_the_same_queries_for_any_number_of_jobs(viewer):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert viewer.get(url("job-list")).status_code == 200
        return len(captured)

    def add_jobs(start: int, n: int) -> None:
        for i in range(start, start + n):
            job = JobDefinitionFactory(name=f"bulk-{i}")
            JobRunFactory(job=job, state=RunState.SUCCEEDED, scheduled_at=at(-5))
            JobRunFactory(job=job, state=RunState.FAILED, scheduled_at=at(-4))

    add_jobs(0, 2)
    queries()  # the user's permissions are loaded once, then cached
    few = queries()
    add_jobs(2, 6)
    assert queries() == few


def test_job_detail_by_dotted_name_with_next_fire_times(viewer):
    JobDefinitionFactory(name="tests.manual", schedule_kind=ScheduleKind.EVERY, cron="",
                         interval=timedelta(minutes=5), timeout=timedelta(seconds=90))  # fmt: skip
    job = viewer.get(url("job-detail", "tests.manual")).json()
    assert job["name"] == "tests.manual"
    assert (job["interval_seconds"], job["timeout_seconds"]) == (300.0, 90.0)
    assert job["catch_up_window_seconds"] is None
    assert job["description"] == "every 5 min"
    times = [parse(t) for t in job["next_fire_times"]]
    assert len(times) == 5 and times[0] == parse(job["next_fire_time"])
    assert all(b - a == timedelta(minutes=5) for a, b in pairwise(times))
    assert job["last_run"] is None


@pytest.mark.parametrize(
    ("name", "value"),
    [("run-detail", str(2**63)), ("run-detail", "9" * 40), ("instance-detail", str(2**64)),
     ("job-detail", "a\x00b"), ("job-detail", "x" * 201), ("node-detail", "n\x00")],
)  # fmt: skip
def test_a_path_that_can_name_no_row_is_404(viewer, name, value):
    """A key beyond the column's range, a NUL character or a name longer than its column is
    a 404 naming the value, never a query the database refuses (a 500)."""
    response = viewer.get(url(name, value))
    assert response.status_code == 404
    assert "No object has the" in response.json()["detail"]


def test_a_jobs_problems_name_a_missing_predecessor(viewer):
    JobDefinitionFactory(name="db.report", schedule_kind=ScheduleKind.ON_DEMAND, cron="",
                         after=["db.gone"])  # fmt: skip
    job = viewer.get(url("job-detail", "db.report")).json()
    [missing] = job["problems"]
    assert "no job named 'db.gone' is declared or stored" in missing
    [listed] = [j for j in viewer.get(url("job-list")).json() if j["name"] == "db.report"]
    assert listed["problems"] == [missing]


def test_a_row_whose_json_python_cannot_read_shows_its_reason(viewer):
    from tests.raw_rows import store_deep_json

    job = JobDefinitionFactory(name="deep", schedule_kind=ScheduleKind.ON_DEMAND, cron="")
    run = JobRunFactory(job=job)
    store_deep_json(JobDefinition, job.pk, "payload")
    store_deep_json(JobRun, run.pk, "payload")
    detail = viewer.get(url("job-detail", "deep"))
    assert detail.status_code == 200
    assert detail.json()["payload"] == "<unreadable JSON: nested 900 levels deep, more than 500>"
    assert any("payload" in problem for problem in detail.json()["problems"])
    answer = viewer.get(url("run-detail", run.pk))
    assert answer.status_code == 200
    assert answer.json()["payload"] == "<unreadable JSON: nested 900 levels deep, more than 500>"
    assert viewer.get(url("run-list")).status_code == 200


def test_unknown_job_is_404(viewer):
    assert viewer.get(url("job-detail", "nope")).status_code == 404


def test_paused_job_fires_after_its_pause(viewer):
    JobDefinitionFactory(name="nightly", cron="0 3 * * *", paused_until=at(3 * 24 * 60),
                         pause_reason="maintenance")  # fmt: skip
    job = viewer.get(url("job-detail", "nightly")).json()
    assert job["paused"] is True and job["pause_reason"] == "maintenance"
    assert parse(job["next_fire_time"]) > parse(job["paused_until"]) > at(3 * 24 * 60 - 1)


@pytest.mark.parametrize("cron", ["0 3 * * *", "0 0 1 * *"])
def test_job_paused_until_resumed_has_no_fire_times(viewer, cron):
    JobDefinitionFactory(name="nightly", cron=cron)
    services.pause("nightly")
    job = viewer.get(url("job-detail", "nightly")).json()
    assert job["paused"] is True and job["paused_until"].startswith("9999-12-31")
    assert (job["next_fire_time"], job["next_fire_times"]) == (None, [])


def test_ended_pause_and_disabled_job(viewer):
    JobDefinitionFactory(name="old-pause", paused_until=at(-1), pause_reason="was")
    JobDefinitionFactory(name="off", enabled=False)
    ended = viewer.get(url("job-detail", "old-pause")).json()
    assert (ended["paused"], ended["paused_until"], ended["pause_reason"]) == (False, None, "")
    assert ended["next_fire_time"] is not None
    off = viewer.get(url("job-detail", "off")).json()
    assert (off["enabled"], off["next_fire_time"], off["next_fire_times"]) == (False, None, [])


# -- runs ---------------------------------------------------------------------------------------


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [run["id"] for run in response.json()["results"]]


def test_run_list_is_newest_first_and_shows_the_job_by_name(cluster, viewer):
    body = viewer.get(url("run-list")).json()
    assert [run["id"] for run in body["results"]] == [
        cluster["running"].pk, cluster["failed"].pk, cluster["ok"].pk
    ]  # fmt: skip
    failed = body["results"][1]
    assert (failed["job"], failed["state"], failed["outcome"], failed["node"]) == (
        "report", "failed", "catch_up", "node-b"
    )  # fmt: skip
    assert failed["error"] == "RuntimeError: boom\nmore"
    assert "traceback" not in failed and "events" not in failed
    assert body["previous"] is None and body["next"] is None


def test_run_list_pages_by_cursor(viewer):
    job = JobDefinitionFactory(name="many")
    made = [JobRunFactory(job=job).pk for _ in range(5)][::-1]
    seen, page = [], url("run-list") + "?page_size=2"
    while page:
        body = viewer.get(page).json()
        assert len(body["results"]) <= 2
        seen += [run["id"] for run in body["results"]]
        page = body["next"]
    assert seen == made


def test_run_list_filters(cluster, viewer):
    other = JobRunFactory(job=JobDefinitionFactory(name="other"), state=RunState.DEAD,
                          outcome=Outcome.MANUAL, node="node-c", scheduled_at=at(-600))  # fmt: skip
    run = url("run-list")
    c = cluster
    assert ids(viewer.get(run, {"job": "other"})) == [other.pk]
    assert ids(viewer.get(run, {"state": "failed"})) == [c["failed"].pk]
    assert ids(viewer.get(run + "?state=failed&state=dead")) == [other.pk, c["failed"].pk]
    assert ids(viewer.get(run, {"outcome": "manual"})) == [other.pk]
    assert ids(viewer.get(run, {"node": "node-a"})) == [c["running"].pk, c["ok"].pk]
    assert ids(viewer.get(run, {"since": at(-25).isoformat()})) == [c["running"].pk,
                                                                    c["failed"].pk]  # fmt: skip
    assert ids(viewer.get(run, {"job": "report", "node": "node-a", "state": "running"})) == [
        c["running"].pk
    ]
    assert ids(viewer.get(run, {"job": "nope"})) == []


@pytest.mark.parametrize(
    ("query", "field"),
    [("state=exploded", "state"), ("outcome=maybe", "outcome"), ("since=yesterday", "since")],
)
def test_run_list_rejects_bad_filters(viewer, query, field):
    response = viewer.get(url("run-list") + "?" + query)
    assert response.status_code == 400
    assert field in response.json()


def test_run_list_takes_the_same_queries_for_any_number_of_runs(viewer):
    job = JobDefinitionFactory(name="q")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert viewer.get(url("run-list")).status_code == 200
        return len(captured)

    JobRunFactory.create_batch(2, job=job)
    queries()  # the user's permissions are loaded once, then cached
    few = queries()
    JobRunFactory.create_batch(6, job=JobDefinitionFactory(name="q2"))
    assert queries() == few


def test_run_detail_has_the_timeline(cluster, viewer):
    run = viewer.get(url("run-detail", cluster["failed"].pk)).json()
    assert run["traceback"] == TRACEBACK
    assert [(e["kind"], e["node"], e["fence"], e["reason"]) for e in run["events"]] == [
        ("claimed", "node-a", None, "won the slot"),
        ("failed", "node-b", 2, ""),
    ]
    assert viewer.get(url("run-detail", 999_999)).status_code == 404


def test_run_detail_has_its_log_beside_the_timeline(cluster, viewer):
    run = viewer.get(url("run-detail", cluster["failed"].pk)).json()
    [line] = run["logs"]
    assert parse(line.pop("at")) == cluster["failed"].logs.get().at
    assert line == {"level": "WARNING", "attempt": 1, "node": "node-b", "trace_id": "ab" * 16,
                    "message": "disk almost full"}  # fmt: skip
    listed = viewer.get(url("run-list")).json()["results"]
    assert all("logs" not in run for run in listed)


# -- nodes, leader, status ----------------------------------------------------------------------


def test_nodes_with_running_runs_and_heartbeat_age(cluster, viewer):
    WorkerNodeFactory(node_id="web-1.example.com", last_heartbeat=at(-2))
    nodes = {n["node_id"]: n for n in viewer.get(url("node-list")).json()}
    assert list(nodes) == ["node-a", "node-b", "web-1.example.com"]
    assert (nodes["node-a"]["running_runs"], nodes["node-b"]["running_runs"]) == (1, 0)
    assert nodes["node-a"]["skipped"] == {"disabled": 1}
    assert nodes["node-b"]["status"] == "draining"
    assert 100 < nodes["web-1.example.com"]["heartbeat_age_seconds"] < 200
    detail = viewer.get(url("node-detail", "web-1.example.com")).json()
    assert detail["node_id"] == "web-1.example.com"
    assert viewer.get(url("node-detail", "nope")).status_code == 404


def test_leader(cluster, viewer):
    leader = viewer.get(url("leader")).json()
    assert (leader["holder"], leader["fence"]) == ("node-a", 4)
    assert parse(leader["expires_at"]) > timezone.now()


def test_no_leader_when_the_lease_expired(viewer):
    LeaseFactory(name="leader", holder="node-a", fence=4, acquired_at=at(-5), expires_at=at(-1))
    assert viewer.get(url("leader")).json() == {
        "holder": None, "since": None, "fence": None, "expires_at": None
    }  # fmt: skip


def test_status_is_the_status_report(cluster, viewer):
    def stable(report: dict) -> dict:
        report = {**report, "generated_at": None}
        report["nodes"] = [{**n, "heartbeat_age_seconds": None} for n in report["nodes"]]
        return report

    body = viewer.get(url("status")).json()
    assert stable(body) == stable(build_status())
    assert body["leader"]["holder"] == "node-a"
    assert [run["id"] for run in body["recent_failures"]] == [cluster["failed"].pk]
    assert viewer.get(url("status"), {"failures": 0}).json()["recent_failures"] == []
    assert viewer.get(url("status"), {"failures": -1}).status_code == 400


# -- actions: trigger and enqueue ---------------------------------------------------------------


def test_trigger_creates_a_pending_manual_run(cluster, operator):
    response = operator.post(url("job-trigger", "report"), {"payload": {"value": 3}}, format="json")
    assert response.status_code == 201
    body = response.json()
    run = JobRun.objects.get(pk=body["id"])
    assert (run.job.name, run.state, run.outcome, run.payload) == (
        "report", RunState.PENDING, Outcome.MANUAL, {"value": 3}
    )  # fmt: skip
    assert run.reason == "triggered by api:operator0"
    assert (body["job"], body["state"], body["outcome"], body["events"]) == (
        "report", "pending", "manual", []
    )  # fmt: skip


def test_trigger_without_a_body_and_of_a_code_job_not_stored_yet(operator):
    assert not JobDefinition.objects.filter(name="tests.manual").exists()
    response = operator.post(url("job-trigger", "tests.manual"))
    assert response.status_code == 201
    assert JobRun.objects.get(pk=response.json()["id"]).payload == {}
    assert JobDefinition.objects.get(name="tests.manual").source == "code"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([1, 2], "Expected a dictionary"),
        ({"nope": 1}, "unexpected keyword argument 'nope'"),
        ({"value": {"too": "many"}, "extra": 2}, "extra"),
    ],
)
def test_trigger_rejects_a_payload_the_job_cannot_take(cluster, operator, payload, message):
    response = operator.post(url("job-trigger", "report"), {"payload": payload}, format="json")
    assert response.status_code == 400
    assert message in str(response.json()["payload"])
    assert not JobRun.objects.filter(outcome=Outcome.MANUAL).exists()


def test_trigger_of_an_unknown_job_is_404_with_the_message(operator):
    response = operator.post(url("job-trigger", "nope"), {}, format="json")
    assert response.status_code == 404
    assert "No job named 'nope'" in response.json()["detail"]


def test_trigger_of_a_stored_job_whose_code_is_gone_is_400(operator):
    JobDefinitionFactory(name="orphan", callable_name="gone.away")
    response = operator.post(url("job-trigger", "orphan"), {}, format="json")
    assert response.status_code == 400
    assert "'gone.away'" in str(response.json()["job"])
    assert not JobRun.objects.exists()


def test_enqueue_with_time_priority_and_key(cluster, operator):
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    body = {"payload": {"value": 2}, "run_at": when.isoformat(), "priority": 7,
            "idempotency_key": "order-42"}  # fmt: skip
    first = operator.post(url("job-enqueue", "report"), body, format="json")
    assert first.status_code == 201
    run = JobRun.objects.get(pk=first.json()["id"])
    assert (run.state, run.outcome, run.due_at, run.scheduled_at, run.priority, run.payload) == (
        RunState.PENDING, Outcome.ENQUEUED, when, when, 7, {"value": 2}
    )  # fmt: skip
    again = operator.post(url("job-enqueue", "report"), body, format="json")
    assert again.status_code == 200 and again.json()["id"] == run.pk
    assert JobRun.objects.filter(outcome=Outcome.ENQUEUED).count() == 1


def test_enqueue_defaults_to_now_and_the_jobs_priority(operator):
    JobDefinitionFactory(name="prio", priority=3)
    response = operator.post(url("job-enqueue", "prio"), {}, format="json")
    run = JobRun.objects.get(pk=response.json()["id"])
    assert run.priority == 3 and abs(run.due_at - timezone.now()) < timedelta(minutes=1)
    other = operator.post(url("job-enqueue", "prio"), {}, format="json").json()["id"]
    assert other != run.pk  # no key: every call is a new run


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"run_at": "soon"}, "run_at"),
        ({"priority": "high"}, "priority"),
        ({"priority": 2**40}, "priority"),
        ({"idempotency_key": "k" * 201}, "idempotency_key"),
        ({"payload": "value=3"}, "payload"),
        ({"payload": {"nope": 1}}, "payload"),
    ],
)
def test_enqueue_validation_errors(cluster, operator, body, field):
    response = operator.post(url("job-enqueue", "report"), body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not JobRun.objects.filter(outcome=Outcome.ENQUEUED).exists()


def test_enqueue_of_an_unknown_job_is_404_with_the_message(operator):
    response = operator.post(url("job-enqueue", "nope"), {"payload": {}}, format="json")
    assert response.status_code == 404
    assert "No job named 'nope'" in response.json()["detail"]


# -- actions: pause and resume ------------------------------------------------------------------


def test_pause_until_with_reason_then_resume(cluster, operator):
    until = at(60).replace(microsecond=0)
    body = {"until": until.isoformat(), "reason": "deploy"}
    response = operator.post(url("job-pause", "report"), body, format="json")
    assert response.status_code == 200
    reason = "deploy (paused by api:operator0)"
    assert (response.json()["paused"], response.json()["pause_reason"]) == (True, reason)
    job = JobDefinition.objects.get(name="report")
    assert (job.paused_until, job.pause_reason) == (until, reason)
    response = operator.post(url("job-resume", "report"))
    assert response.status_code == 200 and response.json()["paused"] is False
    job.refresh_from_db()
    assert (job.paused_until, job.pause_reason) == (None, "")


def test_pause_without_terms_is_until_resumed_by_whom(cluster, operator):
    response = operator.post(url("job-pause", "report"), {}, format="json")
    assert response.json()["pause_reason"] == "paused by api:operator0"
    assert JobDefinition.objects.get(name="report").paused_until == services.FOREVER


@pytest.mark.parametrize(
    ("body", "field"),
    [({"until": "2000-01-01T00:00:00Z"}, "until"), ({"until": "later"}, "until"),
     ({"reason": "x" * 201}, "reason")],
)  # fmt: skip
def test_pause_validation_errors(cluster, operator, body, field):
    response = operator.post(url("job-pause", "report"), body, format="json")
    assert response.status_code == 400 and field in response.json()
    assert JobDefinition.objects.get(name="report").paused_until is None


def test_pause_and_resume_of_an_unknown_job_are_404(operator):
    assert operator.post(url("job-pause", "nope"), {}, format="json").status_code == 404
    assert operator.post(url("job-resume", "nope")).status_code == 404


# -- actions: cancel, replay, drain -------------------------------------------------------------


def test_cancel_flags_a_running_run_and_records_who(cluster, operator):
    run = cluster["running"]
    response = operator.post(url("run-cancel", run.pk))
    assert response.status_code == 202
    assert response.json()["cancel_requested"] is True
    event = RunEvent.objects.get(run=run, kind=EventKind.CANCEL_REQUESTED)
    assert (event.node, event.fence) == ("api:operator0", run.fence)


def test_cancel_of_a_finished_run_is_a_conflict(cluster, operator):
    response = operator.post(url("run-cancel", cluster["ok"].pk))
    assert response.status_code == 409 and "only running runs" in response.json()["detail"].lower()
    assert not JobRun.objects.get(pk=cluster["ok"].pk).cancel_requested
    assert operator.post(url("run-cancel", 999_999)).status_code == 404


def test_replay_makes_a_fresh_linked_run(cluster, operator):
    failed = cluster["failed"]
    response = operator.post(url("run-replay", failed.pk))
    assert response.status_code == 201
    fresh = JobRun.objects.get(pk=response.json()["id"])
    assert (fresh.state, fresh.outcome, fresh.origin_id) == (
        RunState.PENDING, Outcome.REPLAY, failed.pk
    )  # fmt: skip
    assert response.json()["origin"] == failed.pk
    event = RunEvent.objects.get(run=failed, kind=EventKind.REPLAYED)
    assert (event.node, event.reason) == ("api:operator0", f"replayed as run {fresh.pk}")


def test_replay_of_a_live_run_is_a_conflict(cluster, operator):
    response = operator.post(url("run-replay", cluster["running"].pk))
    assert response.status_code == 409
    assert not JobRun.objects.filter(outcome=Outcome.REPLAY).exists()


def test_drain_an_active_node(cluster, operator):
    response = operator.post(url("node-drain", "node-a"))
    assert response.status_code == 202
    assert response.json()["status"] == "draining"
    assert WorkerNode.objects.get(node_id="node-a").status == NodeStatus.DRAINING


def test_drain_of_a_node_that_is_not_active(cluster, operator):
    assert operator.post(url("node-drain", "node-b")).status_code == 409
    assert operator.post(url("node-drain", "nope")).status_code == 404

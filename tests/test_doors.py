"""Every door refuses what the engine cannot use: the admin's job form, the API, the services,
``runjob``, the system checks, the status report; stored rows already refused are reported."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from rest_framework.test import APIClient

from django_cluster_jobs import ImproperlyDeclared, InvalidPayload, registry, services
from django_cluster_jobs.models import JobDefinition, JobRun, RunState, Source
from django_cluster_jobs.status import build_status
from tests.admin.test_admin import form_data
from tests.factories import JobDefinitionFactory, JobRunFactory

pytestmark = pytest.mark.django_db


def admin_url(view: str = "changelist", *args: object) -> str:
    return reverse(f"admin:cluster_jobs_jobdefinition_{view}", args=args)


def api_url(name: str, *args: object) -> str:
    return reverse(f"cluster_jobs_api:{name}", args=args)


@pytest.fixture
def api(admin_user) -> APIClient:
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


# -- the admin's job form (items 2 and 9) ---------------------------------------------------------

NIGHTLY = {"name": "nightly", "callable_name": "tests.manual", "schedule_kind": "cron",
           "cron": "0 2 * * *", "timezone": "UTC"}  # fmt: skip


#: What the add form posts untouched, read once (each page takes a while to render).
_ADD_FORM: dict[str, object] = {}


def add_job(client, **overrides: object):
    path = admin_url("add")
    if not _ADD_FORM:
        _ADD_FORM.update(form_data(client, path))
    data = {**_ADD_FORM, **NIGHTLY, **overrides}
    return client.post(path, {k: v for k, v in data.items() if v is not None})


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [({"backoff": '{"kind": "linear"}'}, "backoff", "fixed"),
     ({"backoff": '{"base": -1}'}, "backoff", "number"),
     ({"backoff": '{"retries": 3}'}, "backoff", "kind, base, factor, cap"),
     ({"backoff": "[1, 2]"}, "backoff", "dict"),
     ({"backoff": '{"cap": NaN}'}, "backoff", "number"),
     ({"executor": "celery"}, "executor", "thread, process"),
     ({"max_attempts": "0"}, "max_attempts", "1 or more"),
     ({"max_attempts": "100000"}, "max_attempts", "at most"),
     ({"catch_up_limit": "0"}, "catch_up_limit", "1 or more"),
     ({"max_concurrency": "0"}, "max_concurrency", "1 or more"),
     ({"breaker_threshold": "0", "breaker_cooldown": "00:05:00"}, "breaker_threshold",
      "1 or more"),
     ({"timeout": "00:00:00"}, "timeout", "positive"),
     ({"timeout": "-00:00:05"}, "timeout", "positive"),
     ({"breaker_threshold": "3", "breaker_cooldown": "-1 00:00:00"}, "breaker_cooldown",
      "positive"),
     ({"catch_up_window": "00:00:00"}, "catch_up_window", "positive"),
     ({"catch_up_window": "999999 00:00:00"}, "catch_up_window", "at most"),
     ({"schedule_kind": "every", "cron": "", "interval": "3000000 00:00:00"}, "interval",
      "at most"),
     ({"schedule_kind": "delay", "cron": "", "interval": "500000 00:00:00"}, "interval",
      "at most"),
     ({"schedule_kind": "delay", "cron": "", "interval": ""}, "interval", "needs an interval"),
     ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
     ({"cron": "@daily"}, "cron", "'0 0 * * *'"),
     ({"cron": "R * * * *"}, "cron", "every node"),
     ({"timezone": "Mars/Olympus"}, "timezone", "not an IANA time zone"),
     ({"payload": "[1, 2]"}, "payload", "must be a JSON object"),
     ({"payload": json.dumps({"value": "x" * 2_000_000})}, "payload", "MAX_PAYLOAD_BYTES"),
     ({"payload": '{"value": "a\\u0000b"}'}, "payload", "NUL"),
     ({"priority": "2000000000"}, "priority", "from -100 to 100"),
     ({"priority": "101"}, "priority", "from -100 to 100"),
     ({"queue": "q" * 101}, "queue", "at most 100"),
     ({"requires": '"gpu"'}, "requires", "as strings"),
     ({"requires": '{"gpu": true}'}, "requires", "as strings"),
     ({"name": "a/b"}, "name", "letters, digits"),
     ({"name": "bad name"}, "name", "letters, digits")],
)  # fmt: skip
def test_the_job_form_refuses_what_the_engine_cannot_use(admin_client, overrides, field, says):
    response = add_job(admin_client, **overrides)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert says in " ".join(errors[field])
    assert not JobDefinition.objects.exists()


def test_the_job_form_accepts_every_bound(admin_client):
    response = add_job(
        admin_client,
        schedule_kind="every", cron="", interval="3660 00:00:00", priority="100",
        catch_up_window="3660 00:00:00", timeout="30 00:00:00", max_attempts="100",
        backoff='{"kind": "exponential", "base": 1, "factor": 100, "cap": 316224000}',
        breaker_threshold="5", breaker_cooldown="3660 00:00:00",
    )  # fmt: skip
    assert response.status_code == 302, response.context["adminform"].form.errors
    job = JobDefinition.objects.get(name="nightly")
    assert (job.interval, job.priority) == (timedelta(days=3660), 100)


def test_the_job_form_takes_a_breaker_threshold_alone_which_pauses_for_five_minutes(admin_client):
    """As with @job, a threshold without a cooldown is usable (the breaker pauses for 5 min)."""
    response = add_job(admin_client, breaker_threshold="3", breaker_cooldown="")
    assert response.status_code == 302, response.context["adminform"].form.errors
    job = JobDefinition.objects.get(name="nightly")
    assert (job.breaker_threshold, job.breaker_cooldown) == (3, None)


# -- item 5: an orphaned code job is shown and deletable -------------------------------------------


def test_an_orphaned_code_row_can_be_deleted_in_the_admin(admin_client):
    gone = JobDefinitionFactory(name="old.name", callable_name="old.name", source=Source.CODE)
    JobRunFactory(job=gone)
    page = admin_client.get(admin_url("delete", gone.pk))
    assert page.status_code == 200
    response = admin_client.post(admin_url("delete", gone.pk), {"post": "yes"})
    assert response.status_code == 302
    assert not JobDefinition.objects.filter(pk=gone.pk).exists()


def test_a_registered_code_row_still_cannot_be_deleted(admin_client):
    kept = JobDefinitionFactory(name="tests.manual", source=Source.CODE)
    assert admin_client.get(admin_url("delete", kept.pk)).status_code == 403


def test_the_job_list_and_page_show_orphaned_and_invalid_definitions(admin_client):
    gone = JobDefinitionFactory(name="old.name", callable_name="old.name", source=Source.CODE)
    JobDefinitionFactory(name="bad", cron="61 * * * *")
    listing = admin_client.get(admin_url()).content.decode()
    assert "orphaned" in listing and "invalid: cron" in listing
    page = admin_client.get(admin_url("change", gone.pk)).content.decode()
    assert "No job named &#x27;old.name&#x27; is registered" in page


def test_an_operator_may_disable_a_code_job_whose_stored_row_is_invalid(admin_client):
    job = JobDefinitionFactory(
        name="tests.manual", source=Source.CODE, priority=2_000_000_000, enabled=True
    )
    response = admin_client.post(admin_url("change", job.pk), {"pause_reason": ""})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.enabled is False and job.priority == 2_000_000_000  # reported, never rewritten


# -- item 1: a run's inputs at the API and the services ------------------------------------------


def test_the_api_refuses_a_priority_outside_the_range(api):
    JobDefinitionFactory(name="report")
    for priority in (2_000_000_000, 101, -101):
        response = api.post(api_url("job-enqueue", "report"), {"priority": priority}, format="json")
        assert response.status_code == 400 and "priority" in response.json()
    assert not JobRun.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [({"run_at": "0001-01-01T00:00:00Z"}, "run_at"),
     ({"run_at": "9999-12-31T23:00:00Z"}, "run_at"),
     ({"idempotency_key": "k\x00"}, "idempotency_key"),
     ({"payload": {"value": "a\x00b"}}, "payload"),
     ({"payload": {"value": "x" * 70_000}}, "payload")],
)  # fmt: skip
def test_the_api_refuses_run_inputs_the_engine_cannot_use(api, body, field):
    JobDefinitionFactory(name="report")
    response = api.post(api_url("job-enqueue", "report"), body, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()
    assert not JobRun.objects.exists()


def test_the_api_refuses_a_pause_beyond_the_calendar(api):
    JobDefinitionFactory(name="report")
    body = {"until": "9999-12-30T00:00:00Z"}
    response = api.post(api_url("job-pause", "report"), body, format="json")
    assert response.status_code == 400 and "until" in response.json()


def test_enqueue_at_the_year_one_is_refused():
    manual = registry.get("tests.manual")
    with pytest.raises(ImproperlyDeclared) as caught:
        manual.enqueue_at(datetime(1, 1, 1, tzinfo=UTC), priority=1)
    error = caught.value
    assert (error.job, error.field) == ("tests.manual", "at")
    assert "1970" in error.hint and "9000" in error.hint
    assert not JobRun.objects.exists()


@pytest.mark.parametrize(
    ("call", "field"),
    [(lambda m: m.enqueue(priority=2_000_000_000), "priority"),
     (lambda m: m.enqueue(priority="high"), "priority"),
     (lambda m: m.enqueue_at(datetime(2030, 1, 1)), "at"),
     (lambda m: m.enqueue_at("2030-01-01"), "at"),
     (lambda m: m.enqueue(idempotency_key="k" * 201), "key"),
     (lambda m: m.enqueue(idempotency_key=5), "key"),
     (lambda m: m.enqueue(valeu=3), "payload")],
)  # fmt: skip
def test_code_that_enqueues_gets_a_clear_error(call, field):
    with pytest.raises(ImproperlyDeclared) as caught:
        call(registry.get("tests.manual"))
    assert (caught.value.job, caught.value.field) == ("tests.manual", field)
    assert not JobRun.objects.exists()


def test_trigger_binds_the_payload_to_the_handler():
    with pytest.raises(InvalidPayload, match="unexpected keyword argument 'nope'"):
        services.trigger("tests.manual", {"nope": 1})


# -- item 6: a poison run is not replayed ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"), [({"payload": [1, 2]}, "payload"), ({"priority": 2**31 - 1}, "priority")]
)
def test_replaying_a_run_the_engine_cannot_take_is_refused(fields, field):
    job = JobDefinitionFactory(name="report")
    poison = JobRunFactory(job=job, state=RunState.DEAD, **fields)
    with pytest.raises(ImproperlyDeclared) as caught:
        services.replay(poison)
    assert (caught.value.job, caught.value.field) == ("report", field)
    assert JobRun.objects.count() == 1


def test_pause_refuses_a_reason_with_nul():
    JobDefinitionFactory(name="report")
    with pytest.raises(ImproperlyDeclared, match="NUL"):
        services.pause("report", reason="a\x00b")
    assert JobDefinition.objects.get(name="report").paused_until is None


# -- runjob ------------------------------------------------------------------------------------


def test_runjob_refuses_a_payload_the_handler_cannot_take_before_claiming():
    with pytest.raises(CommandError, match="unexpected keyword argument 'nope'"):
        call_command("runjob", "tests.manual", "--payload", '{"nope": 1}', verbosity=0)
    assert not JobRun.objects.exists()


# -- item 5 and the stored rows: system checks ---------------------------------------------------


def ours(*ids: str) -> list[checks.CheckMessage]:
    """This app's messages with these ids, from every check `check --database default` runs."""
    found = checks.run_checks(databases=["default"])
    return [m for m in found if m.id in ids]


def test_an_orphaned_definition_is_a_warning_not_an_error():
    JobDefinitionFactory(name="old.name", callable_name="old.name", source=Source.CODE)
    JobDefinitionFactory(name="mine", callable_name="gone.job", source=Source.DATABASE)
    JobDefinitionFactory(name="fine", callable_name="tests.manual")
    assert ours("cluster_jobs.E003", "cluster_jobs.W003") == [
        checks.Warning(
            "Job 'mine' is orphaned: its callable 'gone.job' is not registered, so no node "
            "runs it.",
            hint="Point it at a registered job in the admin, or delete it there.",
            id="cluster_jobs.W003",
        ),
        checks.Warning(
            "Job 'old.name' is orphaned: its callable 'old.name' is not registered, so no node "
            "runs it.",
            hint="Its code was renamed or removed: declare it again with @job, or delete the "
            "row in the admin (its runs go with it).",
            id="cluster_jobs.W003",
        ),
    ]


def test_commands_run_with_an_orphaned_definition():
    JobDefinitionFactory(name="old.name", callable_name="old.name", source=Source.CODE)
    call_command("check", databases=["default"], stdout=io.StringIO(), stderr=io.StringIO())
    call_command("schedulerstatus", stdout=io.StringIO())


def test_a_code_job_using_an_operators_database_job_name_is_an_error():
    JobDefinitionFactory(name="tests.boom", callable_name="tests.manual", source=Source.DATABASE)
    assert ours("cluster_jobs.E004") == [
        checks.Error(
            "The code job 'tests.boom' (declared by tests.jobs.boom) has the name of a job an "
            "operator defined in the database (running 'tests.manual').",
            hint="Rename one of them: give the code job another name with @job(name=...), or "
            "rename the database job in the admin.",
            id="cluster_jobs.E004",
        )
    ]


def test_a_stored_database_job_the_validator_refuses_is_a_warning():
    JobDefinitionFactory(name="bad", cron="61 * * * *", priority=2_000_000_000)
    JobDefinitionFactory(name="tests.manual", source=Source.CODE, priority=500)
    [warning] = ours("cluster_jobs.W004")
    assert warning.id == "cluster_jobs.W004"
    assert warning.msg.startswith("Job 'bad' is stored with a definition no node can use: ")
    assert "invalid cron '61 * * * *': not a valid cron expression" in warning.msg
    assert "invalid priority 2000000000: use a whole number from -100 to 100" in warning.msg
    assert warning.hint == "Correct it in the admin; until then no node plans it."


# -- item 6: the status report shows each job's problems ---------------------------------------


def test_the_status_report_lists_each_jobs_problems():
    JobDefinitionFactory(name="bad", cron="61 * * * *")
    JobDefinitionFactory(name="orphan", callable_name="gone.job")
    JobDefinitionFactory(name="fine")
    jobs = {job["name"]: job for job in build_status()["jobs"]}
    assert jobs["fine"]["problems"] == []
    [cron] = jobs["bad"]["problems"]
    assert cron.startswith("Job 'bad': invalid cron '61 * * * *': ")
    [orphaned] = jobs["orphan"]["problems"]
    assert "No job named 'gone.job' is registered" in orphaned


def test_the_status_report_names_a_missing_predecessor():
    # Deleted in the admin, or removed from the code with its row: the dependent says why it
    # is never queued.
    JobDefinitionFactory(name="db.report", schedule_kind="on_demand", cron="",
                         after=["db.gone"])  # fmt: skip
    jobs = {job["name"]: job for job in build_status()["jobs"]}
    [missing] = jobs["db.report"]["problems"]
    assert missing.startswith("Job 'db.report': invalid after ['db.gone']: no job named 'db.gone'")


def test_schedulerstatus_text_shows_the_problems():
    JobDefinitionFactory(name="bad", cron="61 * * * *")
    out = io.StringIO()
    call_command("schedulerstatus", stdout=out)
    assert "INVALID: Job 'bad': invalid cron '61 * * * *'" in out.getvalue()

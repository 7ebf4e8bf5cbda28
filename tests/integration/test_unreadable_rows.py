"""A stored row holding a value no converter reads is left out of every list and named, with
its reason: in the admin (a message above the page), the API (a header on a list, a 409 for the
row itself), the status report (``unreadable``), the log (once) and the metrics."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.urls import reverse

from django_cluster_jobs.models import JobDefinition, JobRun, RunState, ScheduleKind
from django_cluster_jobs.status import build_status
from django_cluster_jobs.stored import _SEEN, unreadable_seen
from tests.api_fixtures import url
from tests.factories import JobDefinitionFactory, JobRunFactory, RunEventFactory
from tests.raw_rows import store_raw

pytestmark = pytest.mark.django_db(transaction=True)

#: Per database, a value of a job definition's column and of a run's that Python cannot read
#: back (SQLite reads text that is no date as None: only its interval, a number of microseconds,
#: fails; no run column of it fails), and the column.
BAD = {
    "postgresql": {"definition": ("paused_until", "CAST('infinity' AS timestamptz)"),
                   "run": ("started_at", "CAST('infinity' AS timestamptz)")},
    "sqlite": {"definition": ("interval", "'ten minutes'"), "run": None},
}  # fmt: skip


@pytest.fixture
def unreadable():
    """A job with a value Python cannot read, one of its runs with one (where the database can
    hold one; else None), and a healthy job with a failed run beside them."""
    if connection.vendor not in BAD:
        pytest.skip(f"{connection.vendor} refuses such a value at the write")
    _SEEN.clear()
    bad = JobDefinitionFactory(name="bad", schedule_kind=ScheduleKind.EVERY, cron="",
                               interval=timedelta(minutes=10))  # fmt: skip
    bad_run = JobRunFactory(job=bad, state=RunState.SUCCEEDED)
    RunEventFactory(run=bad_run)
    good = JobDefinitionFactory(name="good", schedule_kind=ScheduleKind.ON_DEMAND, cron="")
    good_run = JobRunFactory(job=good, state=RunState.FAILED, error="boom")
    store_raw(JobDefinition, bad.pk, *BAD[connection.vendor]["definition"])
    if BAD[connection.vendor]["run"] is None:
        return bad, None, good, good_run
    store_raw(JobRun, bad_run.pk, *BAD[connection.vendor]["run"])
    return bad, bad_run, good, good_run


def column() -> str:
    return BAD[connection.vendor]["definition"][0]


def test_the_admin_lists_name_the_row_they_leave_out(admin_client, unreadable, caplog):
    bad, bad_run, good, good_run = unreadable
    with caplog.at_level(logging.ERROR, logger="django_cluster_jobs"):
        jobs = admin_client.get(reverse("admin:cluster_jobs_jobdefinition_changelist"))
        admin_client.get(reverse("admin:cluster_jobs_jobdefinition_changelist"))
    assert jobs.status_code == 200
    assert list(jobs.context["cl"].result_list) == [good]
    said = [str(m) for m in jobs.wsgi_request._messages]
    assert len(said) == 1
    assert said[0].startswith(f"Job {bad.pk} cannot be read from the database: {column()}: ")
    assert "Correct that value in table cluster_jobs_jobdefinition with SQL" in said[0]
    named = f"Job {bad.pk} cannot"
    logged = [r.getMessage() for r in caplog.records if named in r.getMessage()]
    assert len(logged) == 1, logged  # once, not at every read
    runs = admin_client.get(reverse("admin:cluster_jobs_jobrun_changelist"))
    assert runs.status_code == 200
    if bad_run is None:
        return
    assert list(runs.context["cl"].result_list) == [good_run]
    assert any(f"Run {bad_run.pk} cannot be read" in str(m)
               for m in runs.wsgi_request._messages)  # fmt: skip


def test_the_admin_page_of_such_a_row_says_why_and_goes_back_to_the_list(admin_client, unreadable):
    bad, bad_run, _, _ = unreadable
    for model, row in (("jobdefinition", bad), ("jobrun", bad_run)):
        if row is None:
            continue
        if model == "jobrun":  # runs are read-only: no delete page, whatever the row
            asked = reverse("admin:cluster_jobs_jobrun_delete", args=[row.pk])
            assert admin_client.get(asked).status_code == 403
        for view in (
            ("change", "delete", "history") if model == "jobdefinition" else ("change", "history")
        ):
            asked = reverse(f"admin:cluster_jobs_{model}_{view}", args=[row.pk])
            page = admin_client.get(asked, follow=True)
            listed = reverse(f"admin:cluster_jobs_{model}_changelist")
            assert page.redirect_chain == [(listed, 302)], (model, view)
            said = [str(m) for m in page.context["messages"]]
            assert len(said) == 1 and "cannot be read from the database" in said[0], said
            assert "deleted" not in said[0]


def test_the_api_names_such_a_row_in_a_list_and_refuses_it_alone(viewer, unreadable):
    bad, bad_run, _, good_run = unreadable
    jobs = viewer.get(url("job-list"))
    assert jobs.status_code == 200
    assert [job["name"] for job in jobs.json()] == ["good"]
    assert jobs["Cluster-Jobs-Unreadable"] == f"cluster_jobs_jobdefinition {bad.pk}"
    assert viewer.get(url("run-list")).status_code == 200
    answers = [viewer.get(url("job-detail", "bad"))]
    if bad_run is not None:
        runs = viewer.get(url("run-list"))
        assert good_run.pk in [run["id"] for run in runs.json()["results"]]
        assert bad_run.pk not in [run["id"] for run in runs.json()["results"]]
        assert runs["Cluster-Jobs-Unreadable"] == f"cluster_jobs_jobrun {bad_run.pk}"
        answers.append(viewer.get(url("run-detail", bad_run.pk)))
    for alone in answers:
        assert alone.status_code == 409
        assert alone.json()["detail"].startswith(("Job ", "Run "))
        assert "cannot be read from the database" in alone.json()["detail"]


def test_the_status_report_lists_such_rows_with_their_reason(viewer, unreadable):
    bad, _, _, good_run = unreadable
    report = build_status()
    assert [job["name"] for job in report["jobs"]] == ["good"]
    assert [f["id"] for f in report["recent_failures"]] == [good_run.pk]
    [row] = report["unreadable"]
    assert (row["table"], row["id"]) == ("cluster_jobs_jobdefinition", bad.pk)
    assert row["problems"][0].startswith(f"{column()}: ")
    assert viewer.get(url("status")).json()["unreadable"] == [row]
    assert unreadable_seen() == {"cluster_jobs_jobdefinition": 1}


def test_the_occurrence_story_and_overview_answer_beside_such_rows(admin_client, unreadable):
    overview = admin_client.get(reverse("admin:cluster_jobs_overview"))
    assert overview.status_code == 200
    assert any("cannot be read" in str(m) for m in overview.wsgi_request._messages)
    story = admin_client.get(f"{reverse('admin:cluster_jobs_occurrence')}?job=good")
    assert story.status_code == 200


def test_the_occurrence_story_names_a_missing_predecessor(admin_client):
    JobDefinitionFactory(name="db.report", schedule_kind=ScheduleKind.ON_DEMAND, cron="",
                         after=["db.gone"])  # fmt: skip
    asked = f"{reverse('admin:cluster_jobs_occurrence')}?job=db.report&at=2026-12-05T09:00:00Z"
    story = admin_client.get(asked)
    assert story.status_code == 200
    assert story.context["story"].problems
    assert "no job named &#x27;db.gone&#x27; is declared or stored" in story.content.decode()

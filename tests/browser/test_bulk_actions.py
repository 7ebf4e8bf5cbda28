"""The bulk actions clicked through in a browser: from the overview to the filtered runs, select
all (more runs than one page shows), the action, its confirmation page, and the result."""

from __future__ import annotations

import pytest
from django.utils import timezone

from django_cluster_jobs.admin.runs import JobRunAdmin
from django_cluster_jobs.models import EventKind, JobRun, RunState
from tests.factories import JobDefinitionFactory, JobRunFactory, RunningRunFactory

pytestmark = pytest.mark.browser

OVERVIEW = "/admin/cluster_jobs/workernode/overview/"


@pytest.fixture(autouse=True)
def short_pages(monkeypatch):
    """Two runs a page, so "select all" reaches runs the page does not show."""
    monkeypatch.setattr(JobRunAdmin, "list_per_page", 2)


def select_all_and_act(page, action: str, total: int) -> None:
    """Tick the page, take "select all", choose ``action`` and press Go."""
    page.check("#action-toggle")
    page.click(f"text=Select all {total} runs")
    assert page.locator("input[name=select_across]").input_value() == "1"
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def test_replay_every_dead_letter_of_a_job(admin_page):
    job = JobDefinitionFactory(name="nightly", cron="0 9 * * *")
    dead = [JobRunFactory(job=job, state=RunState.DEAD, payload={"value": i}) for i in range(5)]
    other = JobRunFactory(job=JobDefinitionFactory(name="other"), state=RunState.DEAD)
    page = admin_page
    page.goto(OVERVIEW)
    page.click("tr.cluster-jobs-job[data-job=nightly] a.cluster-jobs-dead-letters")
    page.wait_for_url("**/jobrun/?job=*&state__exact=dead")
    select_all_and_act(page, "replay_dead_letters", 5)

    page.wait_for_selector("#cluster-jobs-bulk")
    confirm = page.inner_text("#cluster-jobs-bulk")
    assert "5 dead-lettered runs not replayed yet will be replayed" in confirm
    assert "job: nightly" in confirm and "state: dead-lettered" in confirm
    assert JobRun.objects.filter(origin__in=dead).count() == 0  # nothing before confirming
    page.click('input[type=submit][value="Yes, I\'m sure"]')

    page.wait_for_selector("ul.messagelist")
    assert "5 dead letters replayed as fresh pending runs." in page.inner_text("ul.messagelist")
    assert sorted(JobRun.objects.filter(origin__in=dead).values_list("origin", flat=True)) == [
        run.pk for run in dead
    ]
    assert not JobRun.objects.filter(origin=other).exists()


def test_cancel_every_pending_run_of_a_queue_after_going_back_once(admin_page):
    reports = [JobDefinitionFactory(name=f"report-{i}", queue="reports") for i in range(2)]
    now = timezone.now()
    waiting = [JobRunFactory(job=reports[i % 2], state=RunState.PENDING, due_at=now)
               for i in range(3)]  # fmt: skip
    running = RunningRunFactory(job=reports[0])
    mail = JobRunFactory(job=JobDefinitionFactory(name="mail"), state=RunState.PENDING)
    page = admin_page
    page.goto(OVERVIEW)
    page.click("tr.cluster-jobs-queue[data-queue=reports] a")
    page.wait_for_url("**/jobrun/?queue=reports&state__exact=pending")
    select_all_and_act(page, "cancel_pending_runs", 3)

    page.wait_for_selector("#cluster-jobs-bulk")
    assert "3 pending runs will be cancelled" in page.inner_text("#cluster-jobs-bulk")
    assert "queue: reports" in page.inner_text("#cluster-jobs-bulk")
    page.click("text=No, take me back")  # back to the runs, nothing changed
    page.wait_for_selector("#result_list")
    assert JobRun.objects.filter(state=RunState.PENDING).count() == 4

    page.reload()
    select_all_and_act(page, "cancel_pending_runs", 3)
    page.click('input[type=submit][value="Yes, I\'m sure"]')
    page.wait_for_selector("ul.messagelist")
    assert "3 pending runs cancelled." in page.inner_text("ul.messagelist")
    for run in waiting:
        run.refresh_from_db()
        assert run.state == RunState.CANCELLED
        assert run.events.filter(kind=EventKind.CANCELLED, node="admin:admin").exists()
    running.refresh_from_db()
    mail.refresh_from_db()
    assert (running.state, mail.state) == (RunState.RUNNING, RunState.PENDING)

"""The cluster overview in a browser: it renders, and each of its links leads where it says."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_cluster_jobs.models import RunState
from tests.factories import JobDefinitionFactory, JobRunFactory, LeaseFactory, WorkerNodeFactory

pytestmark = pytest.mark.browser

OVERVIEW = "/admin/cluster_jobs/workernode/overview/"


@pytest.fixture
def cluster():
    now = timezone.now()
    WorkerNodeFactory(node_id="node-a")
    WorkerNodeFactory(node_id="node-b")
    LeaseFactory(name="leader", holder="node-a", fence=7, acquired_at=now,
                 expires_at=now + timedelta(minutes=5))  # fmt: skip
    healthy = JobDefinitionFactory(name="alpha", cron="* * * * *")
    failing = JobDefinitionFactory(name="zeta", cron="* * * * *", queue="reports")
    # In the hour before this one, whatever the minute now: its cell's story is its last minute.
    top = now.replace(minute=0, second=0, microsecond=0)
    JobRunFactory(job=healthy, scheduled_at=top - timedelta(minutes=1), state=RunState.SUCCEEDED)
    JobRunFactory(job=failing, scheduled_at=top - timedelta(minutes=2), state=RunState.DEAD)
    JobRunFactory(job=failing, scheduled_at=top - timedelta(minutes=1), state=RunState.FAILED)
    JobRunFactory(job=failing, state=RunState.PENDING, scheduled_at=top - timedelta(minutes=3))
    return {"alpha": healthy, "zeta": failing, "top": top}


def cell(job: str, start) -> str:
    """The strip cell of ``job`` for the hour that begins at ``start``, by its title (by position,
    it would move when the page is drawn in the next hour)."""
    hour = f"{start:%Y-%m-%d %H}:00 UTC"
    return f'tr.cluster-jobs-job[data-job={job}] .cluster-jobs-strip a[title^="{hour}"]'


def test_the_overview_renders_nodes_leader_jobs_and_queues(admin_page, cluster):
    page = admin_page
    page.goto("/admin/cluster_jobs/workernode/")
    page.click("text=Cluster overview")
    page.wait_for_url(f"**{OVERVIEW}")
    assert "Leader: node-a (fencing token 7)." in page.inner_text("#content-main")
    nodes = page.locator("#cluster-jobs-nodes tbody tr")
    assert nodes.count() == 2
    assert [("(leader)" in row) for row in nodes.all_inner_texts()].count(True) == 1
    rows = page.locator("tr.cluster-jobs-job")
    assert [rows.nth(i).get_attribute("data-job") for i in range(rows.count())] == ["zeta", "alpha"]
    assert "failing" in rows.nth(0).inner_text()
    assert page.locator("tr.cluster-jobs-job[data-job=zeta] .cluster-jobs-strip a").count() == 24
    top = cluster["top"]
    assert page.locator(cell("zeta", top - timedelta(hours=1))).get_attribute("class") == "failed"
    assert page.locator(cell("zeta", top)).get_attribute("class") == ""
    assert "1 dead-lettered run in the ledger." in page.inner_text("#content-main")
    assert page.locator("tr.cluster-jobs-queue[data-queue=reports]").count() == 1


def test_each_link_of_the_overview_leads_to_its_page(admin_page, cluster):
    page = admin_page
    page.goto(OVERVIEW)
    page.click("tr.cluster-jobs-job[data-job=zeta] >> text=zeta")
    page.wait_for_url("**/jobrun/?q=zeta")
    assert page.locator("#result_list tbody tr").count() == 3

    page.goto(OVERVIEW)
    page.click("tr.cluster-jobs-job[data-job=zeta] a.cluster-jobs-dead-letters")
    page.wait_for_url("**/jobrun/?job=*&state__exact=dead")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "dead-lettered" in page.inner_text("#result_list")

    page.goto(OVERVIEW)
    page.click("tr.cluster-jobs-queue[data-queue=reports] a")
    page.wait_for_url("**/jobrun/?queue=reports&state__exact=pending")
    assert page.locator("#result_list tbody tr").count() == 1

    page.goto(OVERVIEW)
    page.locator(cell("zeta", cluster["top"] - timedelta(hours=1))).click()
    page.wait_for_url("**/occurrence/?job=zeta&at=*")
    verdict = page.locator(".cluster-jobs-verdict")
    assert verdict.get_attribute("data-verdict") == "failed"
    assert "It ran and failed." in verdict.inner_text()

    page.goto(OVERVIEW)
    page.click("#content-main >> text=Why didn't it run?")
    page.wait_for_url("**/occurrence/")
    assert page.locator("#id_job option").all_inner_texts() == ["alpha", "zeta"]

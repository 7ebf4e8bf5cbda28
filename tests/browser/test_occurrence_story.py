"""The "why didn't it run?" page in a browser: an occurrence's story in each case it tells.

Each case is set up with factories, asked for through the page's form (pick the job, type the
instant, submit), and read as the operator reads it: the verdict, the why, the runs and their
timeline, and the link to the run's own page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    EventKind,
    JobDefinition,
    Outcome,
    RunState,
)
from django_cluster_jobs.services import FOREVER
from tests.factories import JobDefinitionFactory, JobRunFactory, RunEventFactory

pytestmark = pytest.mark.browser

STORY = "/admin/cluster_jobs/workernode/occurrence/"
NINE = datetime(2026, 5, 28, 9, tzinfo=UTC)
KEY = "2026-05-28T09:00:00Z"


@dataclass
class Case:
    """What to set up for the 09:00 occurrence of job nightly, and what its story must say."""

    verdict: str
    says: list[str]
    run: dict | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # kind, node, reason
    job: dict = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)
    asked: str = "2026-05-28T09:00:00Z"


CASES = {
    "paused": Case(
        "settled",
        ["it was not due when it came (the job was paused", "Paused until",
         "nightly: paused until resumed by admin:alice"],
        job={"paused_until": FOREVER, "pause_reason": "maintenance (paused by admin:alice)"},
        changes=["nightly: paused until resumed by admin:alice"],
    ),
    "disabled": Case(
        "disabled",
        ["Not due: the job is disabled", "The job is disabled now."],
        job={"enabled": False},
    ),
    "before the job existed": Case(
        "before_job", ["Not due: the job did not exist yet."], asked="2026-05-01T09:00:00Z"
    ),
    "claimed by a node": Case(
        "ran",
        ["It ran.", "node-b", "won the slot"],
        run={"state": RunState.SUCCEEDED, "node": "node-b", "outcome": Outcome.WON},
        events=[(EventKind.CLAIMED, "node-b", "won the slot"),
                (EventKind.SUCCEEDED, "node-b", "")],
    ),
    "skipped": Case(
        "skipped",
        ["It was skipped.", "overlap: the previous run is still live"],
        run={"state": RunState.SKIPPED, "error": "overlap: the previous run is still live"},
        events=[(EventKind.SKIPPED, "node-a", "overlap: the previous run is still live")],
    ),
    "missed": Case(
        "missed",
        ["It was missed", "its misfire policy settled it", "fire_once ran the latest instead"],
        run={"state": RunState.MISSED, "error": "missed: fire_once ran the latest instead"},
        events=[(EventKind.MISSED, "node-a", "missed: fire_once ran the latest instead")],
    ),
    "retried": Case(
        "ran",
        ["It ran.", "retried", "attempt 2 due at"],
        run={"state": RunState.SUCCEEDED, "node": "node-a", "attempt": 2},
        events=[(EventKind.CLAIMED, "node-a", ""),
                (EventKind.FAILED, "node-a", "RuntimeError: flaky"),
                (EventKind.RETRIED, "node-a", "attempt 2 due at 09:00:05"),
                (EventKind.SUCCEEDED, "node-a", "")],
    ),
    "taken over": Case(
        "ran",
        ["It ran.", "lease expired", "taken over", "node-c"],
        run={"state": RunState.SUCCEEDED, "node": "node-c", "attempt": 2},
        events=[(EventKind.CLAIMED, "node-a", ""),
                (EventKind.LEASE_EXPIRED, "node-a", "lease expired; pending again"),
                (EventKind.TAKEN_OVER, "node-c", ""),
                (EventKind.SUCCEEDED, "node-c", "")],
    ),
}  # fmt: skip


def set_up(case: Case):
    job = JobDefinitionFactory(name="nightly", cron="0 9 * * *")
    JobDefinition.objects.filter(pk=job.pk).update(
        created_at=NINE - timedelta(days=10), settled_through=NINE + timedelta(days=1), **case.job
    )
    for detail in case.changes:
        ClusterEvent.objects.create(at=NINE - timedelta(hours=2), detail=detail,
                                    kind=ClusterEventKind.JOB_CHANGED)  # fmt: skip
    if case.run is None:
        return None
    run = JobRunFactory(job=job, key=KEY, scheduled_at=NINE, **case.run)
    for at, (kind, node, reason) in enumerate(case.events):
        RunEventFactory(run=run, kind=kind, node=node, reason=reason,
                        at=NINE + timedelta(seconds=at))  # fmt: skip
    return run


@pytest.mark.parametrize("name", CASES)
def test_the_story_of_each_case(admin_page, name):
    case = CASES[name]
    run = set_up(case)
    page = admin_page
    page.goto(STORY)
    page.select_option("#id_job", "nightly")
    page.fill("#id_at", case.asked)
    page.click("input[type=submit][value='Tell its story']")
    page.wait_for_url("**/occurrence/?job=nightly&at=*")
    assert page.locator(".cluster-jobs-verdict").get_attribute("data-verdict") == case.verdict
    story = page.inner_text("#content-main")
    for words in case.says:
        assert words in story, (name, words, story)
    if run is None:
        assert page.locator("#cluster-jobs-story-runs").count() == 0
        return
    timeline = page.locator("#cluster-jobs-story-events tbody tr").all_inner_texts()
    assert [row.split("\t")[1] for row in timeline] == [
        str(EventKind(kind).label) for kind, _node, _reason in case.events
    ]
    page.click(f"#cluster-jobs-story-runs >> text={KEY}")
    page.wait_for_url(f"**/jobrun/{run.pk}/change/")
    assert str(RunState(run.state).label) in page.inner_text("#content-main")

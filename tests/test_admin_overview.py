"""The console's cluster overview and "why didn't it run?": each page rendered, its content read."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from django_cluster_jobs.admin.text import fire_times_around, next_offset_change
from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    EventKind,
    JobDefinition,
    Outcome,
    PauseCause,
    RunState,
)
from tests.factories import (
    JobDefinitionFactory,
    JobRunFactory,
    LeaseFactory,
    RunEventFactory,
    WorkerNodeFactory,
)

pytestmark = pytest.mark.django_db

OVERVIEW = reverse("admin:cluster_jobs_overview")
STORY = reverse("admin:cluster_jobs_occurrence")
NINE = datetime(2026, 5, 28, 9, tzinfo=UTC)


def backdate(job: JobDefinition, created: datetime, settled: datetime) -> JobDefinition:
    """Give a job an earlier creation and mark than the factory's (both are set on save)."""
    JobDefinition.objects.filter(pk=job.pk).update(created_at=created, settled_through=settled)
    job.refresh_from_db()
    return job


def text(response) -> str:
    """The page's visible text, tags removed and spaces collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split())


def job_rows(response) -> list[str]:
    return re.findall(r'class="cluster-jobs-job" data-job="([^"]+)"', response.content.decode())


def cell_at(strip: list, at: datetime):
    """The cell of ``strip`` for the hour ``at`` falls in (the report's current hour may have
    begun after the test wrote its runs)."""
    [cell] = [c for c in strip if c.start <= at < c.start + timedelta(hours=1)]
    return cell


def verdict(response) -> str:
    return re.search(r'data-verdict="([a-z_]+)"', response.content.decode()).group(1)


# -- the overview --------------------------------------------------------------------------


def test_the_overview_shows_nodes_leader_strips_dead_letters_and_queues(admin_client):
    now = timezone.now()
    WorkerNodeFactory(node_id="node-a")
    LeaseFactory(name="leader", holder="node-a", fence=7, acquired_at=now,
                 expires_at=now + timedelta(seconds=30))  # fmt: skip
    healthy = JobDefinitionFactory(name="alpha", cron="* * * * *")
    failing = JobDefinitionFactory(name="zeta", cron="* * * * *")
    recent, earlier = now - timedelta(minutes=1), now - timedelta(hours=2)
    JobRunFactory(job=healthy, scheduled_at=recent, state=RunState.SUCCEEDED)
    JobRunFactory(job=failing, scheduled_at=earlier, state=RunState.DEAD)
    JobRunFactory(job=failing, scheduled_at=recent, state=RunState.FAILED)
    JobRunFactory(job=healthy, key="pending-1", state=RunState.PENDING, scheduled_at=recent)
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    page = text(response)
    assert "Leader: node-a (fencing token 7)" in page
    assert "node-a (leader)" in page
    assert job_rows(response) == ["zeta", "alpha"]  # failing first, then by name
    assert "failing" in page and "1 dead-lettered run in the ledger." in page
    strip = response.context["report"]["jobs"][0]["strip"]
    assert len(strip) == 24
    assert cell_at(strip, recent).worst == "failed" and cell_at(strip, earlier).worst == "failed"
    alpha = cell_at(response.context["report"]["jobs"][1]["strip"], recent)
    assert alpha.worst == "live" and alpha.counts == {"ran": 1, "live": 1}
    assert response.context["report"]["queues"][0]["queue"] == "default"
    assert response.context["report"]["queues"][0]["depth"] == 1
    assert 'class="failed"' in response.content.decode()


def test_dead_letters_and_queues_link_to_the_runs_a_bulk_action_acts_on(admin_client):
    job = JobDefinitionFactory(name="alpha", cron="* * * * *", queue="reports")
    JobRunFactory(job=job, state=RunState.DEAD)
    JobRunFactory(job=job, state=RunState.PENDING, scheduled_at=timezone.now())
    page = admin_client.get(OVERVIEW).content.decode()
    runs = reverse("admin:cluster_jobs_jobrun_changelist")
    assert f'href="{runs}?job={job.pk}&amp;state__exact=dead">1</a>' in page
    assert f'href="{runs}?queue=reports&amp;state__exact=pending">reports</a>' in page


def test_the_current_hour_tells_the_latest_occurrence_so_far(admin_client):
    JobDefinitionFactory(name="alpha", cron="* * * * *")
    response = admin_client.get(OVERVIEW)
    report = response.context["report"]
    current, earlier = report["jobs"][0]["strip"][-1], report["jobs"][0]["strip"][-2]
    now = datetime.fromisoformat(report["generated_at"]).astimezone(UTC)
    at = now.isoformat().replace("+00:00", "Z").replace(":", "%3A")
    assert current.url.endswith(f"at={at}")
    assert earlier.url.endswith(f"at={earlier.start:%Y-%m-%dT%H}%3A59%3A59.999000Z")


def test_a_breaker_open_job_comes_first_and_says_so(admin_client):
    JobDefinitionFactory(name="alpha", cron="* * * * *")
    JobDefinitionFactory(
        name="omega", cron="* * * * *", paused_until=timezone.now() + timedelta(minutes=5),
        pause_reason="3 consecutive failed runs", pause_cause=PauseCause.BREAKER,
    )  # fmt: skip
    response = admin_client.get(OVERVIEW)
    assert job_rows(response) == ["omega", "alpha"]
    assert "breaker open" in text(response)


def test_breaker_open_is_the_stored_cause_never_the_reason_text(admin_client):
    soon = timezone.now() + timedelta(minutes=5)
    JobDefinitionFactory(name="alpha", cron="* * * * *")
    JobDefinitionFactory(name="omega", cron="* * * * *", paused_until=soon,
                         pause_reason="circuit breaker: words an operator typed",
                         pause_cause=PauseCause.OPERATOR)  # fmt: skip
    JobDefinitionFactory(name="ended", cron="* * * * *", pause_cause=PauseCause.BREAKER,
                         paused_until=timezone.now() - timedelta(minutes=1))  # fmt: skip
    response = admin_client.get(OVERVIEW)
    assert job_rows(response) == ["alpha", "ended", "omega"]
    assert "breaker open" not in text(response)
    assert not any(job["breaker_open"] for job in response.context["report"]["jobs"])


def test_the_overview_without_a_leader_or_nodes_says_so(admin_client):
    page = text(admin_client.get(OVERVIEW))
    assert "No leader right now." in page and "No node has registered." in page
    assert "No pending run is due." in page


def test_the_pages_need_the_view_permission(client):
    user = User.objects.create_user("nobody", is_staff=True)
    client.force_login(user)
    assert client.get(OVERVIEW).status_code == 403
    assert client.get(STORY).status_code == 403


def test_the_nodes_page_links_to_both(admin_client):
    page = admin_client.get(reverse("admin:cluster_jobs_workernode_changelist")).content.decode()
    assert OVERVIEW in page and STORY in page


# -- the story of one occurrence ------------------------------------------------------------


@pytest.fixture
def nightly() -> JobDefinition:
    job = JobDefinitionFactory(name="nightly", cron="0 9 * * *")
    return backdate(job, NINE - timedelta(days=10), NINE + timedelta(days=1))


def story(client, job: str, at: str):
    response = client.get(STORY, {"job": job, "at": at})
    assert response.status_code == 200
    return response


def test_a_run_tells_who_claimed_it_and_its_timeline(admin_client, nightly):
    run = JobRunFactory(job=nightly, key="2026-05-28T09:00:00Z", scheduled_at=NINE,
                        state=RunState.SUCCEEDED, node="node-b", outcome=Outcome.WON)  # fmt: skip
    RunEventFactory(run=run, kind=EventKind.CLAIMED, node="node-b", reason="won the slot")
    RunEventFactory(run=run, kind=EventKind.SUCCEEDED, node="node-b")
    response = story(admin_client, "nightly", "2026-05-28T09:30:00Z")  # snapped to 09:00
    assert verdict(response) == "ran"
    page = text(response)
    assert "It ran." in page and "The latest occurrence at or before" in page
    assert "node-b" in page and "won the slot" in page and "claimed" in page
    assert reverse("admin:cluster_jobs_jobrun_change", args=[run.pk]) in response.content.decode()


@pytest.mark.parametrize(
    ("state", "reason", "expected", "words"),
    [
        (RunState.SKIPPED, "overlap: the previous run is still live", "skipped",
         "It was skipped."),
        (RunState.MISSED, "missed: fire_once ran the latest instead", "missed",
         "its misfire policy settled it"),
        (RunState.FAILED, "RuntimeError: boom", "failed", "It ran and failed."),
        (RunState.RUNNING, "", "live", "It is pending or running now."),
    ],
)  # fmt: skip
def test_each_recorded_end_has_its_verdict(admin_client, nightly, state, reason, expected, words):
    run = JobRunFactory(job=nightly, key="2026-05-28T09:00:00Z", scheduled_at=NINE, state=state,
                        node="", error=reason)  # fmt: skip
    RunEventFactory(run=run, kind=EventKind.SKIPPED if state == RunState.SKIPPED
                    else EventKind.CLAIMED, node="", reason=reason)  # fmt: skip
    response = story(admin_client, "nightly", "2026-05-28T09:00:00Z")
    assert verdict(response) == expected
    assert words in text(response)
    if reason:
        assert reason in text(response)


def test_a_retried_and_taken_over_run_shows_each_step(admin_client, nightly):
    run = JobRunFactory(job=nightly, key="2026-05-28T09:00:00Z", scheduled_at=NINE, attempt=2,
                        state=RunState.SUCCEEDED, node="node-c")  # fmt: skip
    for kind, node in (
        (EventKind.CLAIMED, "node-a"),
        (EventKind.RETRIED, "node-a"),
        (EventKind.TAKEN_OVER, "node-c"),
        (EventKind.SUCCEEDED, "node-c"),
    ):
        RunEventFactory(run=run, kind=kind, node=node)  # fmt: skip
    page = text(story(admin_client, "nightly", "2026-05-28T09:00:00Z"))
    assert page.index("claimed") < page.index("retried") < page.index("taken over")


def test_not_due_before_the_job_existed(admin_client, nightly):
    response = story(admin_client, "nightly", "2026-05-01T09:00:00Z")
    assert verdict(response) == "before_job"
    assert "the job did not exist yet" in text(response)


def test_not_due_yet_in_the_future(admin_client, nightly):
    assert verdict(story(admin_client, "nightly", "2999-01-01T09:00:00Z")) == "future"


def test_decided_without_a_row_names_pause_disable_schedule_or_retention(admin_client, nightly):
    ClusterEvent.objects.create(
        at=NINE - timedelta(days=1, hours=2),
        kind=ClusterEventKind.JOB_CHANGED,
        detail="nightly: paused",
    )
    ClusterEvent.objects.create(
        at=NINE - timedelta(days=1, hours=2),
        kind=ClusterEventKind.JOB_CHANGED,
        detail="other: paused",
    )
    response = story(admin_client, "nightly", "2026-05-27T09:00:00Z")
    assert verdict(response) == "settled"
    page = text(response)
    assert "purged by retention" in page
    assert "Changes to the job around then" in page
    assert "nightly: paused" in page and "other: paused" not in page


def test_past_the_mark_and_unclaimed_is_not_decided_yet(admin_client, nightly):
    backdate(nightly, nightly.created_at, NINE - timedelta(days=3))
    assert verdict(story(admin_client, "nightly", "2026-05-27T09:00:00Z")) == "undecided"


def test_a_disabled_job_without_a_run(admin_client, nightly):
    JobDefinition.objects.filter(pk=nightly.pk).update(enabled=False)
    response = story(admin_client, "nightly", "2026-05-27T09:00:00Z")
    assert verdict(response) == "disabled" and "The job is disabled now." in text(response)


def test_an_on_demand_job_has_no_occurrence(admin_client):
    JobDefinitionFactory(name="manual", schedule_kind="on_demand", cron="")
    assert verdict(story(admin_client, "manual", "2026-05-27T09:00:00Z")) == "no_occurrence"


def test_a_bad_instant_or_an_unknown_job_is_said_plainly(admin_client, nightly):
    assert "Give the instant as an ISO date and time" in text(story(admin_client, "nightly", "x"))
    assert "No job is named ghost." in text(story(admin_client, "ghost", "2026-05-27T09:00Z"))
    form = admin_client.get(STORY).content.decode()
    assert 'value="Tell its story"' in form and '<option value="nightly">' in form


@pytest.mark.parametrize(
    "at", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1969-12-31T23:59:59Z",
           "9000-01-01T00:00:01Z", "2026-13-45T99:00:00Z"],
)  # fmt: skip
def test_an_instant_at_the_calendars_edge_is_said_plainly(admin_client, nightly, at):
    """The story's hours around such an instant would not be dates: the page says which
    instants it takes instead of failing."""
    assert "from 1970-01-01 to 9000-01-01" in text(story(admin_client, "nightly", at))


@pytest.mark.parametrize("name", ["night\x00ly", "x" * 201])
def test_a_name_no_job_can_have_is_an_unknown_job(admin_client, nightly, name):
    assert "No job is named" in text(story(admin_client, name, "2026-05-27T09:00Z"))


# -- a job's fire times across a DST change -------------------------------------------------


def test_the_next_dst_change_is_found_to_the_hour():
    after = datetime(2026, 1, 10, tzinfo=UTC)
    assert next_offset_change("Europe/Paris", after) == datetime(2026, 3, 29, 1, tzinfo=UTC)
    autumn = datetime(2026, 10, 25, 1, tzinfo=UTC)
    assert next_offset_change("Europe/Paris", datetime(2026, 6, 1, tzinfo=UTC)) == autumn
    assert next_offset_change("UTC", after) is None
    assert next_offset_change("Nowhere/Atlantis", after) is None


def test_fire_times_around_a_spring_change_skip_the_missing_hour():
    job = JobDefinitionFactory(name="early", cron="30 2 * * *", timezone="Europe/Paris")
    change = datetime(2026, 3, 29, 1, tzinfo=UTC)
    times = fire_times_around(job.get_schedule(), change)
    local = [t.astimezone(ZoneInfo("Europe/Paris")).strftime("%m-%d %H:%M") for t in times]
    assert len(times) == 5 and times[1] < change <= times[2]
    assert local[:2] == ["03-27 02:30", "03-28 02:30"]
    assert "03-29 02:30" not in local  # 02:30 does not exist that night


def test_the_job_page_previews_fire_times_across_the_next_dst_change(admin_client):
    job = JobDefinitionFactory(name="paris", cron="0 9 * * *", timezone="Europe/Paris")
    change = reverse("admin:cluster_jobs_jobdefinition_change", args=[job.pk])
    page = text(admin_client.get(change))
    assert "Fire times across the next DST change:" in page
    assert "The clocks of Europe/Paris change at" in page
    utc = JobDefinitionFactory(name="utc", cron="0 9 * * *", timezone="UTC")
    page = text(admin_client.get(reverse("admin:cluster_jobs_jobdefinition_change",
                                         args=[utc.pk])))  # fmt: skip
    assert "UTC changes no clock within a year." in page

"""Bulk actions on every run a filter matches: confirmed, permission-checked, logged, chunked."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_cluster_jobs.admin import bulk
from django_cluster_jobs.ledger import get_ledger
from django_cluster_jobs.models import EventKind, JobRun, Outcome, RunState
from tests.admin.pages import url
from tests.factories import JobDefinitionFactory, JobRunFactory, RunningRunFactory

pytestmark = pytest.mark.django_db

RUNS = url("jobrun")
TRIGGER, MANAGE = "trigger_jobdefinition", "manage_jobdefinition"


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of two runs, so a handful of runs crosses several chunks."""
    monkeypatch.setattr(bulk, "CHUNK", 2)


def post(client, action: str, query: str = "", *, across: bool = True, runs=(), **extra):
    """Post ``action`` from the changelist at ``query``, on every match (or on ``runs``)."""
    shown = list(runs) or list(JobRun.objects.all()[:1])
    data = {
        "action": action,
        "select_across": "1" if across else "0",
        "index": "0",
        "_selected_action": [run.pk for run in shown],
        **extra,
    }
    return client.post(f"{RUNS}{query}", data, follow=True)


def confirm_page(client, action: str, query: str = "", **kwargs) -> str:
    response = post(client, action, query, **kwargs)
    assert response.status_code == 200
    assert response.templates[0].name == "admin/cluster_jobs/bulk_confirm.html"
    return response.content.decode()


def confirmed(page: str) -> dict[str, str]:
    """The confirmation form's hidden fields, as the browser would post them back."""
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)
    data: dict = {}
    for name, value in fields:
        if name == "_selected_action":
            data.setdefault(name, []).append(value)
        elif name != "csrfmiddlewaretoken":
            data[name] = value
    return data


def apply(client, page: str, query: str = ""):
    return client.post(f"{RUNS}{query}", confirmed(page), follow=True)


def text(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split())


def log_messages(run) -> list[str]:
    entries = LogEntry.objects.filter(object_id=str(run.pk), content_type__model="jobrun")
    return [f"{e.user.username}: {e.change_message}" for e in entries]


@pytest.fixture
def dead_letters():
    """Five dead letters of job nightly (one already replayed), one of another job."""
    nightly, other = JobDefinitionFactory(name="nightly"), JobDefinitionFactory(name="other")
    dead = [JobRunFactory(job=nightly, state=RunState.DEAD, payload={"value": i})
            for i in range(5)]  # fmt: skip
    JobRunFactory(job=nightly, state=RunState.PENDING, outcome=Outcome.REPLAY, origin=dead[0])
    elsewhere = JobRunFactory(job=other, state=RunState.DEAD)
    failed = JobRunFactory(job=nightly, state=RunState.FAILED)
    return {"job": nightly, "dead": dead, "elsewhere": elsewhere, "failed": failed}


def replays_of(run) -> int:
    return JobRun.objects.filter(origin=run).count()


# -- replay every dead letter of a job -------------------------------------------------------


def test_the_confirmation_states_the_count_and_the_filter_and_changes_nothing(
    admin_client, dead_letters
):
    query = f"?job={dead_letters['job'].pk}"
    page = confirm_page(admin_client, "replay_dead_letters", query)
    words = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "4 dead-lettered runs not replayed yet will be replayed" in words
    assert "Every run that matches this filter, on every page: job: nightly" in words
    assert 'name="confirmed" value="4"' in page and 'name="select_across" value="1"' in page
    assert JobRun.objects.filter(outcome=Outcome.REPLAY).count() == 1
    assert LogEntry.objects.count() == 0


def test_replay_all_matching_replays_each_dead_letter_of_the_filter_once(
    admin_client, dead_letters, small_chunks
):
    query = f"?job={dead_letters['job'].pk}&state__exact=dead"
    page = confirm_page(admin_client, "replay_dead_letters", query)
    response = apply(admin_client, page, query)
    assert response.redirect_chain[-1][0].endswith(query)
    assert "4 dead letters replayed as fresh pending runs." in text(response)
    assert [replays_of(run) for run in dead_letters["dead"]] == [1, 1, 1, 1, 1]
    assert replays_of(dead_letters["elsewhere"]) == replays_of(dead_letters["failed"]) == 0
    fresh = JobRun.objects.get(origin=dead_letters["dead"][3])
    assert (fresh.state, fresh.payload) == (RunState.PENDING, {"value": 3})
    assert log_messages(dead_letters["dead"][3]) == [f"admin: Replayed as run {fresh.pk}."]
    assert dead_letters["dead"][3].events.filter(kind=EventKind.REPLAYED,
                                                 node="admin:admin").exists()  # fmt: skip
    assert log_messages(dead_letters["dead"][0]) == []  # replayed before: left alone
    # Confirmed again, nothing is replayed twice.
    assert "0 dead letters replayed" in text(apply(admin_client, page, query))
    assert [replays_of(run) for run in dead_letters["dead"]] == [1, 1, 1, 1, 1]


def test_a_dead_letter_replayed_after_the_confirmation_is_not_replayed_again(
    admin_client, dead_letters
):
    page = confirm_page(admin_client, "replay_dead_letters", f"?job={dead_letters['job'].pk}")
    JobRunFactory(job=dead_letters["job"], state=RunState.PENDING, outcome=Outcome.REPLAY,
                  origin=dead_letters["dead"][1])  # someone else replayed it  # fmt: skip
    response = apply(admin_client, page, f"?job={dead_letters['job'].pk}")
    assert "3 dead letters replayed" in text(response)
    assert "4 matched when you confirmed" in text(response)
    assert replays_of(dead_letters["dead"][1]) == 1


def test_a_dead_letter_the_handler_refuses_stays_at_its_boundary(admin_client, dead_letters):
    bad = dead_letters["dead"][2]
    JobRun.objects.filter(pk=bad.pk).update(payload={"unknown": 1})
    response = apply(admin_client, confirm_page(admin_client, "replay_dead_letters",
                                                f"?job={dead_letters['job'].pk}"),
                     f"?job={dead_letters['job'].pk}")  # fmt: skip
    page = text(response)
    assert "3 dead letters replayed" in page
    assert "1 dead letter not replayed:" in page and "nightly" in page and "unknown" in page
    assert replays_of(bad) == 0 and log_messages(bad) == []


def test_only_the_ticked_runs_without_select_all(admin_client, dead_letters):
    ticked = dead_letters["dead"][1:3]
    page = confirm_page(admin_client, "replay_dead_letters", across=False, runs=ticked)
    assert "Among the 2 runs you selected." in " ".join(re.sub(r"<[^>]+>", " ", page).split())
    apply(admin_client, page)
    assert [replays_of(run) for run in dead_letters["dead"]] == [1, 1, 1, 0, 0]


# -- cancel every pending run of a queue -----------------------------------------------------


@pytest.fixture
def queues():
    """Pending runs of queue "reports" (three, over two jobs) and of "default", one running."""
    a = JobDefinitionFactory(name="report-a", queue="reports")
    b = JobDefinitionFactory(name="report-b", queue="reports")
    other = JobDefinitionFactory(name="mail", queue="default")
    now = timezone.now()
    pending = [JobRunFactory(job=job, state=RunState.PENDING, due_at=now - timedelta(seconds=1),
                             fence=i) for i, job in enumerate((a, a, b))]  # fmt: skip
    running = RunningRunFactory(job=a)
    elsewhere = JobRunFactory(job=other, state=RunState.PENDING)
    return {"pending": pending, "running": running, "elsewhere": elsewhere, "jobs": [a, b]}


def state(run) -> str:
    run.refresh_from_db()
    return run.state


def test_cancel_all_pending_runs_of_a_queue(admin_client, queues, small_chunks):
    query = "?queue=reports"
    page = confirm_page(admin_client, "cancel_pending_runs", query)
    assert "3 pending runs will be cancelled" in page and "queue: <strong>reports" in page
    response = apply(admin_client, page, query)
    assert "3 pending runs cancelled." in text(response)
    assert [state(run) for run in queues["pending"]] == [RunState.CANCELLED] * 3
    assert state(queues["running"]) == RunState.RUNNING
    assert state(queues["elsewhere"]) == RunState.PENDING
    run = queues["pending"][2]
    event = run.events.get(kind=EventKind.CANCELLED)
    assert (event.node, event.fence) == ("admin:admin", 2)
    assert event.reason == "cancelled before it started by admin:admin"
    assert run.finished_at is not None and run.reason == event.reason
    assert log_messages(run) == ["admin: Cancelled before it started."]
    assert log_messages(queues["running"]) == log_messages(queues["elsewhere"]) == []


def test_a_pending_run_a_node_took_after_the_confirmation_is_not_cancelled(admin_client, queues):
    page = confirm_page(admin_client, "cancel_pending_runs", "?queue=reports")
    now = timezone.now()
    taken = get_ledger().vendor.take_pending("node-z", [queues["jobs"][1].pk], 1, now,
                                             now + timedelta(seconds=30))  # fmt: skip
    assert [won.run_id for won in taken] == [queues["pending"][2].pk]
    response = apply(admin_client, page, "?queue=reports")
    assert "2 pending runs cancelled." in text(response)
    assert "3 matched when you confirmed" in text(response)
    assert state(queues["pending"][2]) == RunState.RUNNING
    assert not queues["pending"][2].events.filter(kind=EventKind.CANCELLED).exists()
    assert log_messages(queues["pending"][2]) == []


def test_the_service_leaves_runs_that_are_not_pending_alone(queues):
    from django_cluster_jobs import services

    ids = [run.pk for run in (*queues["pending"], queues["running"])]
    assert services.cancel_pending(ids, by="api:bot") == ids[:3]
    assert services.cancel_pending(ids, by="api:bot") == []
    assert state(queues["running"]) == RunState.RUNNING


def test_nothing_matches_and_nothing_is_offered(admin_client, queues):
    page = confirm_page(admin_client, "cancel_pending_runs", "?queue=reports&state__exact=dead")
    assert "0 pending runs will be cancelled" in page and "Nothing to do." in page
    assert 'name="apply"' not in page


# -- permissions and the chunks --------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "needed", "other"),
    [("replay_dead_letters", TRIGGER, MANAGE), ("cancel_pending_runs", MANAGE, TRIGGER)],
)
def test_without_its_permission_neither_offered_confirmed_nor_run(
    staff, dead_letters, queues, action, needed, other
):
    client = staff(other)
    assert f'value="{action}"' not in client.get(RUNS).content.decode()
    response = post(client, action)
    assert response.templates[0].name != "admin/cluster_jobs/bulk_confirm.html"
    assert "No action selected." in text(response)
    data = {"action": action, "select_across": "1", "apply": "1",
            "_selected_action": [dead_letters["dead"][1].pk]}  # fmt: skip
    client.post(RUNS, data)
    assert replays_of(dead_letters["dead"][1]) == 0
    assert state(queues["pending"][0]) == RunState.PENDING
    assert LogEntry.objects.count() == 0


@pytest.mark.parametrize(
    ("action", "needed"), [("replay_dead_letters", TRIGGER), ("cancel_pending_runs", MANAGE)]
)
def test_with_its_permission_it_runs_and_is_logged(staff, dead_letters, queues, action, needed):
    client = staff(needed)
    assert f'value="{action}"' in client.get(RUNS).content.decode()
    apply(client, confirm_page(client, action))
    entries = LogEntry.objects.all()
    assert entries.count() == 5  # every match, as the confirmation counted
    assert {e.user.username for e in entries} == {"operator"}


def test_chunks_read_each_chunk_with_a_limit_never_every_key(small_chunks):
    runs = [JobRunFactory(state=RunState.PENDING) for _ in range(5)]
    with CaptureQueriesContext(connection) as queries:
        found = list(bulk.chunks(JobRun.objects.all()))
    assert found == [[r.pk for r in runs[:2]], [r.pk for r in runs[2:4]], [runs[4].pk]]
    assert len(queries) == 4 and all("LIMIT 2" in q["sql"] for q in queries)

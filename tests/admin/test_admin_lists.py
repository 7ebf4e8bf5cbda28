"""The admin as an operator reads it: times to the second with their zone, the key columns, the
runs' errors, a neutral cancel request, links from messages, and who acted."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    EventKind,
    JobDefinition,
    JobRun,
    RunState,
)
from tests.admin.pages import page, url
from tests.factories import (
    JobDefinitionFactory,
    JobRunFactory,
    LeaseFactory,
    RunEventFactory,
    WorkerNodeFactory,
)

pytestmark = pytest.mark.django_db

#: An instant with non-zero seconds, so a format that drops them shows.
T = datetime(2026, 5, 28, 7, 8, 9, tzinfo=UTC)
#: T as the admin shows it in UTC and in Paris (summer time).
T_UTC, T_PARIS = "2026-05-28 07:08:09 UTC", "2026-05-28 09:08:09 CEST"


@pytest.fixture
def stamped():
    """One row of every ledger model, each time at T."""
    job = JobDefinitionFactory(name="report")
    run = JobRunFactory(job=job, scheduled_at=T, due_at=T, created_at=T, started_at=T,
                        finished_at=T + timedelta(seconds=2), state=RunState.FAILED,
                        error="RuntimeError: " + "x" * 300 + "\nsecond line")  # fmt: skip
    event = RunEventFactory(run=run, at=T, kind=EventKind.FAILED)
    node = WorkerNodeFactory(node_id="node-a", started_at=T, last_heartbeat=T)
    lease = LeaseFactory(name="lock:x", holder="node-a", acquired_at=T, expires_at=T)
    cluster = ClusterEvent.objects.create(at=T, kind=ClusterEventKind.REAPED, detail="reaped")
    return {"jobrun": run, "runevent": event, "workernode": node, "lease": lease,
            "clusterevent": cluster, "jobdefinition": job}  # fmt: skip


# -- times -------------------------------------------------------------------------------------

MODELS = ["jobrun", "runevent", "workernode", "lease", "clusterevent"]


# The node list shows ages and, for the leader, since when (tested below), but no time column.
@pytest.mark.parametrize("model", [m for m in MODELS if m != "workernode"])
def test_lists_show_times_to_the_second_with_their_zone(admin_client, stamped, model):
    assert T_UTC in page(admin_client, url(model))


@pytest.mark.parametrize("model", MODELS)
def test_pages_show_times_to_the_second_with_their_zone(admin_client, stamped, model):
    assert T_UTC in page(admin_client, url(model, "change", stamped[model].pk))


@override_settings(TIME_ZONE="Europe/Paris")
def test_times_are_in_the_current_time_zone(admin_client, stamped):
    assert T_PARIS in page(admin_client, url("jobrun"))


def test_the_run_page_timeline_shows_seconds(admin_client, stamped):
    body = page(admin_client, url("jobrun", "change", stamped["jobrun"].pk))
    assert body.count(T_UTC) >= 5  # scheduled, due, created, started, the failed event


def test_the_job_page_shows_its_times_to_the_second(admin_client, stamped):
    job = stamped["jobdefinition"]
    JobDefinition.objects.filter(pk=job.pk).update(created_at=T, updated_at=T)
    JobRun.objects.filter(pk=stamped["jobrun"].pk).update(state=RunState.SUCCEEDED)
    body = page(admin_client, url("jobdefinition", "change", job.pk))
    assert body.count(T_UTC) == 2  # created, updated
    assert body.count("2026-05-28 07:08:11 UTC") == 2  # last run, last success: when it ended


def test_the_job_list_shows_last_run_and_pause_end_to_the_second(admin_client, stamped):
    until = datetime(2100, 1, 2, 3, 4, 5, tzinfo=UTC)
    JobDefinition.objects.filter(name="report").update(paused_until=until, pause_reason="why")
    body = page(admin_client, url("jobdefinition"))
    assert f"failed · {T_UTC}" in body
    assert "until 2100-01-02 03:04:05 UTC: why" in body


def test_the_node_list_says_when_the_leader_took_over_to_the_second(admin_client, stamped):
    LeaseFactory(name="leader", holder="node-a", fence=4, acquired_at=T,
                 expires_at=datetime(2100, 1, 1, tzinfo=UTC))  # fmt: skip
    body = page(admin_client, url("workernode"))
    assert f"Leader: <strong>node-a</strong> since {T_UTC}" in body
    assert f"leader since {T_UTC}, fence 4" in body


# -- the lists' columns ------------------------------------------------------------------------


def test_the_runs_list_shows_the_first_line_of_the_error_shortened(admin_client, stamped):
    body = page(admin_client, url("jobrun"))
    [cell] = re.findall(r'<td class="field-error_summary">(.*?)</td>', body)
    assert cell.startswith("RuntimeError: xxx") and cell.endswith("…")
    assert len(cell) <= 100 and "second line" not in cell
    assert page(admin_client, url("jobrun", "change", stamped["jobrun"].pk)).count("second line")


def columns(client, model: str) -> list[str]:
    return re.findall(r'<th scope="col" class="[^"]*column-(\w+)', page(client, url(model)))


# Chosen with a screenshot at 1366 px beside the admin's navigation and filters: these fit.
@pytest.mark.parametrize(
    ("model", "shown"),
    [("jobrun", ["scheduled", "job", "state", "error_summary", "duration", "node"]),
     ("workernode", ["node_id", "leader", "status", "heartbeat_age", "running_runs", "skips",
                     "clock_offset"]),
     ("jobdefinition", ["name", "schedule", "source", "enabled", "paused", "last_run",
                        "next_fire_time", "problems"])],
)  # fmt: skip
def test_lists_keep_their_key_columns_and_no_more(admin_client, stamped, model, shown):
    assert columns(admin_client, model) == shown


def test_lists_let_long_names_and_errors_wrap(admin_client, stamped):
    assert "cluster_jobs/admin.css" in page(admin_client, url("jobrun"))


# -- a cancel request -----------------------------------------------------------------------


@pytest.mark.parametrize("state", [RunState.SUCCEEDED, RunState.FAILED, RunState.RUNNING])
def test_a_cancel_request_is_shown_as_plain_text(admin_client, state):
    run = JobRunFactory(state=state, cancel_requested=True)
    body = page(admin_client, url("jobrun", "change", run.pk))
    field = re.search(r'field-cancel_request.*?<div class="readonly">(.*?)</div>', body, re.S)
    assert field is not None
    assert "<img" not in field.group(1) and "icon-" not in field.group(1)
    if state == RunState.SUCCEEDED:
        assert "Requested; the run ended as succeeded." in field.group(1)


def test_no_cancel_request_is_not_shown_as_a_failure(admin_client):
    run = JobRunFactory(state=RunState.SUCCEEDED)
    body = page(admin_client, url("jobrun", "change", run.pk))
    field = re.search(r'field-cancel_request.*?<div class="readonly">(.*?)</div>', body, re.S)
    assert "icon-no" not in field.group(1)


# -- messages ----------------------------------------------------------------------------------


def test_run_now_links_to_the_run_it_queued(admin_client):
    job = JobDefinitionFactory(name="report")
    data = {"action": "run_now", "_selected_action": [job.pk], "index": "0"}
    body = admin_client.post(url("jobdefinition"), data, follow=True).content.decode()
    run = JobRun.objects.get(job=job)
    assert f'<a href="{url("jobrun", "change", run.pk)}">' in body


# -- who acted ---------------------------------------------------------------------------------


def act(client, model: str, action: str, obj, **extra: str):
    data = {"action": action, "_selected_action": [obj.pk], "index": "0", **extra}
    return client.post(url(model), data, follow=True)


def test_a_pause_from_the_admin_records_who_paused(admin_client):
    job = JobDefinitionFactory(name="report")
    act(admin_client, "jobdefinition", "pause_jobs", job, apply="1", duration="", reason="db")
    job.refresh_from_db()
    assert job.pause_reason == "db (paused by admin:admin)"


@pytest.mark.parametrize(
    ("model", "action", "make", "says"),
    [("jobdefinition", "resume_jobs",
      lambda: JobDefinitionFactory(name="j", paused_until=datetime(2100, 1, 1, tzinfo=UTC)),
      "j: resumed by admin:admin"),
     ("jobdefinition", "disable_jobs", lambda: JobDefinitionFactory(name="j"),
      "j: disabled by admin:admin"),
     ("jobdefinition", "enable_jobs", lambda: JobDefinitionFactory(name="j", enabled=False),
      "j: enabled by admin:admin"),
     ("workernode", "drain", lambda: WorkerNodeFactory(node_id="n"),
      "drain requested by admin:admin")],
)  # fmt: skip
def test_admin_actions_record_who_acted(admin_client, caplog, model, action, make, says):
    from django_cluster_jobs.models import ClusterEvent

    caplog.set_level(logging.INFO, logger="django_cluster_jobs")
    act(admin_client, model, action, make())
    assert list(ClusterEvent.objects.values_list("detail", flat=True)) == [says]
    [record] = [r for r in caplog.records if says in r.getMessage()]
    assert record.actor == "admin:admin"

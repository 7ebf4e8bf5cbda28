"""The admin: every page loads, the ledger is read-only, and operators change only what they may."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_cluster_jobs.admin import CODE_OWNED, describe_cron, fire_times_table, interval_text
from django_cluster_jobs.models import (
    EventKind,
    JobDefinition,
    NodeStatus,
    RunState,
    ScheduleKind,
    Source,
    WorkerNode,
)
from django_cluster_jobs.registry import registry
from tests.factories import (
    JobDefinitionFactory,
    JobRunFactory,
    LeaseFactory,
    RunEventFactory,
    RunningRunFactory,
    WorkerNodeFactory,
)

pytestmark = pytest.mark.django_db

TRACEBACK = 'Traceback (most recent call last):\n  File "jobs.py", line 3\nRuntimeError: <boom>'


def url(model: str, view: str = "changelist", *args: object) -> str:
    return reverse(f"admin:cluster_jobs_{model}_{view}", args=args)


def rows(response) -> list:
    return list(response.context["cl"].result_list)


def count_queries(client, path: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return len(queries)


def make_jobs(n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        job = JobDefinitionFactory(name=f"bulk-{i}", cron="*/5 * * * *")
        RunEventFactory(run=JobRunFactory(job=job, state=RunState.FAILED, node="node-a"))


@pytest.fixture
def ledger():
    """One of everything: a cron job with a failed run and its timeline, a node, a lease."""
    job = JobDefinitionFactory(name="report", cron="0 9 * * *", timezone="Europe/Paris")
    run = JobRunFactory(
        job=job, key="2026-05-28T07:00:00Z", state=RunState.FAILED, node="node-a",
        error="RuntimeError: <boom>", traceback=TRACEBACK, payload={"x": 1},
        started_at=timezone.now(), finished_at=timezone.now() + timedelta(seconds=2),
    )  # fmt: skip
    RunEventFactory(run=run, kind=EventKind.CLAIMED, reason="won the slot")
    RunEventFactory(run=run, kind=EventKind.FENCED_OUT, node="node-b", fence=2)
    node = WorkerNodeFactory(node_id="node-a", skipped={"claimed_elsewhere": 3, "disabled": 1})
    lease = LeaseFactory(name="leader", holder="node-a", fence=4,
                         expires_at=timezone.now() + timedelta(seconds=30))  # fmt: skip
    return {"jobdefinition": job, "jobrun": run, "workernode": node, "lease": lease,
            "runevent": run.events.first()}  # fmt: skip


@pytest.fixture
def viewer(client):
    """A staff user who may view every ledger model but holds no manage permission."""
    user = User.objects.create_user("viewer", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    client.force_login(user)
    return client


# -- every page loads --------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["jobdefinition", "jobrun", "runevent", "workernode", "lease"])
def test_changelist_and_change_page_load(admin_client, ledger, model):
    assert admin_client.get(url(model)).status_code == 200
    assert admin_client.get(url(model, "change", ledger[model].pk)).status_code == 200


def test_add_page_of_a_job_loads(admin_client):
    assert admin_client.get(url("jobdefinition", "add")).status_code == 200


@pytest.mark.parametrize("model", ["jobdefinition", "jobrun", "workernode"])
def test_changelist_queries_do_not_grow_with_rows(
    admin_client, django_assert_max_num_queries, model
):
    make_jobs(2)
    WorkerNodeFactory.create_batch(2)
    count_queries(admin_client, url(model))  # warm the session and content types
    baseline = count_queries(admin_client, url(model))
    make_jobs(20, start=2)
    WorkerNodeFactory.create_batch(20)
    with django_assert_max_num_queries(baseline):
        assert admin_client.get(url(model)).status_code == 200


# -- jobs --------------------------------------------------------------------------------------


def test_cron_job_page_shows_the_next_five_fire_times_in_its_zone_and_utc(admin_client, ledger):
    job = ledger["jobdefinition"]
    page = admin_client.get(url("jobdefinition", "change", job.pk)).content.decode()
    upcoming = job.get_schedule().upcoming(timezone.now(), 5)
    assert page.count("09:00:00 CE") == 5  # CET or CEST, whatever the season
    first = upcoming[0]
    assert first.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in page
    assert "At 09:00 (Europe/Paris)" in page


def test_job_list_shows_schedule_last_run_and_next_fire_time(admin_client, ledger):
    JobDefinitionFactory(name="idle", schedule_kind=ScheduleKind.EVERY, interval=timedelta(hours=1),
                         cron="", enabled=False)  # fmt: skip
    response = admin_client.get(url("jobdefinition"))
    by_name = {job.name: job for job in rows(response)}
    assert by_name["report"].last_run_state == RunState.FAILED
    assert by_name["idle"].last_run_at is None
    page = response.content.decode()
    assert '<td class="field-schedule">every 1 h</td>' in page
    assert '<td class="field-next_fire_time">disabled</td>' in page
    assert '<td class="field-last_run">failed · ' in page


@pytest.mark.parametrize(
    ("kind", "says"),
    [("delay", "after the previous run finished"), ("startup", "scheduler starts"),
     ("on_demand", "only when triggered")],
)  # fmt: skip
def test_jobs_without_fixed_times_say_why(admin_client, kind, says):
    job = JobDefinitionFactory(schedule_kind=kind, cron="", interval=timedelta(seconds=90))
    page = admin_client.get(url("jobdefinition", "change", job.pk)).content.decode()
    assert says in page


def test_job_page_links_last_run_success_and_failure(admin_client, ledger):
    job = ledger["jobdefinition"]
    ok = JobRunFactory(job=job, state=RunState.SUCCEEDED,
                       scheduled_at=timezone.now() - timedelta(days=1))  # fmt: skip
    page = admin_client.get(url("jobdefinition", "change", job.pk)).content.decode()
    assert url("jobrun", "change", ok.pk) in page
    assert url("jobrun", "change", ledger["jobrun"].pk) in page


def test_code_job_schedule_is_read_only_but_enabled_is_editable(admin_client):
    job = JobDefinitionFactory(name="declared", source=Source.CODE, callable_name="tests.manual")
    before = job.updated_at
    page = admin_client.get(url("jobdefinition", "change", job.pk)).content.decode()
    assert 'name="cron"' not in page and 'name="schedule_kind"' not in page
    assert 'name="enabled"' in page
    response = admin_client.post(
        url("jobdefinition", "change", job.pk), {"cron": "0 0 * * *", "pause_reason": ""}
    )
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.enabled, job.cron) == (False, "* * * * *")
    assert job.updated_at > before  # nodes re-plan when updated_at moves


def test_code_job_cannot_be_deleted(admin_client):
    job = JobDefinitionFactory(source=Source.CODE)
    assert admin_client.get(url("jobdefinition", "delete", job.pk)).status_code == 403


def test_code_owned_fields_cover_the_declaration():
    assert set(registry.get("tests.manual").definition_fields()) <= set(CODE_OWNED)


@pytest.mark.parametrize(("action", "enabled"), [("disable_jobs", False), ("enable_jobs", True)])
def test_enable_and_disable_actions(admin_client, action, enabled):
    job = JobDefinitionFactory(enabled=not enabled)
    before = job.updated_at
    admin_client.post(url("jobdefinition"), {"action": action, "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.enabled is enabled and job.updated_at > before


def test_enabled_toggles_from_the_list(admin_client):
    job = JobDefinitionFactory(name="listed", source=Source.CODE)
    data = {
        "form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-0-id": str(job.pk),
        "_save": "Save",
    }  # fmt: skip
    assert admin_client.post(url("jobdefinition"), data).status_code == 302
    job.refresh_from_db()
    assert job.enabled is False


def job_form(**overrides: object) -> dict:
    data = {
        "name": "nightly", "callable_name": "tests.manual", "schedule_kind": "cron",
        "cron": "0 2 * * *", "timezone": "UTC", "placement": "cluster",
        "delivery": "at_least_once", "overlap": "skip", "misfire": "fire_once",
        "max_attempts": "1", "priority": "0", "queue": "default", "backoff": "{}",
        "requires": "[]", "payload": "{}", "enabled": "on",
    }  # fmt: skip
    return {**data, **overrides}


def test_database_job_is_created_from_the_admin(admin_client):
    response = admin_client.post(url("jobdefinition", "add"), job_form())
    assert response.status_code == 302
    assert JobDefinition.objects.get(name="nightly").source == Source.DATABASE


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [({"callable_name": "nope"}, "callable_name", "No job named 'nope'"),
     ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
     ({"timezone": "Mars/Base"}, "timezone", "not an IANA time zone"),
     ({"schedule_kind": "every", "cron": ""}, "interval", "needs an interval")],
)  # fmt: skip
def test_database_job_form_refuses_what_the_scheduler_cannot_use(
    admin_client, overrides, field, says
):
    response = admin_client.post(url("jobdefinition", "add"), job_form(**overrides))
    assert response.status_code == 200
    assert says in " ".join(response.context["adminform"].form.errors[field])


@pytest.mark.parametrize(
    ("query", "names"),
    [("enabled__exact=0", {"off"}), ("schedule_kind__exact=every", {"rate"}),
     ("source__exact=code", {"rate"}), ("placement__exact=every_node", {"off"}),
     ("q=rat", {"rate"})],
)  # fmt: skip
def test_job_filters_and_search(admin_client, query, names):
    JobDefinitionFactory(name="rate", source=Source.CODE, schedule_kind="every",
                         interval=timedelta(seconds=5))  # fmt: skip
    JobDefinitionFactory(name="off", enabled=False, placement="every_node")
    JobDefinitionFactory(name="plain")
    response = admin_client.get(f"{url('jobdefinition')}?{query}")
    assert response.status_code == 200
    assert {job.name for job in rows(response)} == names


# -- runs --------------------------------------------------------------------------------------


def test_runs_are_read_only(admin_client, ledger):
    run = ledger["jobrun"]
    assert admin_client.get(url("jobrun", "add")).status_code == 403
    assert (
        admin_client.post(url("jobrun", "change", run.pk), {"state": "pending"}).status_code == 403
    )
    assert admin_client.get(url("jobrun", "delete", run.pk)).status_code == 403
    page = admin_client.get(url("jobrun", "change", run.pk)).content.decode()
    assert 'name="_save"' not in page and "deletelink" not in page
    run.refresh_from_db()
    assert run.state == RunState.FAILED


def test_run_page_shows_traceback_payload_and_timeline(admin_client, ledger):
    run = ledger["jobrun"]
    page = admin_client.get(url("jobrun", "change", run.pk)).content.decode()
    assert "<pre>Traceback (most recent call last):" in page
    assert "RuntimeError: &lt;boom&gt;</pre>" in page
    assert "&quot;x&quot;: 1" in page
    assert "won the slot" in page and "fenced out" in page and "node-b" in page
    assert "2 s" in page  # duration


@pytest.mark.parametrize(
    ("query", "keys"),
    [("state__exact=failed", {"k-failed"}), ("outcome__exact=manual", {"k-manual"}),
     ("node=node-b", {"k-manual"}), ("q=k-fai", {"k-failed"}), ("q=other", {"k-manual"}),
     ("scheduled_at__year=2025", {"k-old"})],
)  # fmt: skip
def test_run_filters_and_search(admin_client, query, keys):
    other = JobDefinitionFactory(name="other")
    JobRunFactory(key="k-failed", state=RunState.FAILED, node="node-a")
    JobRunFactory(job=other, key="k-manual", outcome="manual", node="node-b")
    JobRunFactory(key="k-old", scheduled_at=datetime(2025, 6, 1, tzinfo=UTC))
    WorkerNodeFactory(node_id="node-b")
    response = admin_client.get(f"{url('jobrun')}?{query}")
    assert response.status_code == 200
    assert {run.key for run in rows(response)} == keys


def test_run_filter_by_job(admin_client):
    mine = JobRunFactory(key="mine")
    JobRunFactory(key="theirs")
    response = admin_client.get(f"{url('jobrun')}?job={mine.job_id}")
    assert [run.key for run in rows(response)] == ["mine"]


# -- nodes and leases --------------------------------------------------------------------------


def test_node_list_shows_skips_and_running_runs(admin_client, ledger):
    RunningRunFactory.create_batch(2, node="node-a")
    response = admin_client.get(url("workernode"))
    assert rows(response)[0].running_count == 2
    page = response.content.decode()
    assert "claimed_elsewhere: 3, disabled: 1" in page
    assert "node=node-a&amp;state__exact=running" in page


def test_drain_moves_active_nodes_to_draining(admin_client):
    active = WorkerNodeFactory(status=NodeStatus.ACTIVE)
    stopped = WorkerNodeFactory(status=NodeStatus.STOPPED)
    response = admin_client.post(
        url("workernode"), {"action": "drain", "_selected_action": [active.pk, stopped.pk]}
    )
    assert response.status_code == 302
    statuses = dict(WorkerNode.objects.values_list("pk", "status"))
    assert statuses == {active.pk: NodeStatus.DRAINING, stopped.pk: NodeStatus.STOPPED}


def test_drain_is_refused_without_the_manage_permission(viewer):
    node = WorkerNodeFactory()
    page = viewer.get(url("workernode")).content.decode()
    assert 'value="drain"' not in page
    viewer.post(url("workernode"), {"action": "drain", "_selected_action": [node.pk]})
    node.refresh_from_db()
    assert node.status == NodeStatus.ACTIVE


def test_drain_is_offered_with_the_manage_permission(viewer):
    user = User.objects.get(username="viewer")
    user.user_permissions.add(Permission.objects.get(codename="manage_jobdefinition"))
    node = WorkerNodeFactory()
    assert 'value="drain"' in viewer.get(url("workernode")).content.decode()
    viewer.post(url("workernode"), {"action": "drain", "_selected_action": [node.pk]})
    node.refresh_from_db()
    assert node.status == NodeStatus.DRAINING


def test_viewer_sees_the_run_timeline(viewer, ledger):
    page = viewer.get(url("jobrun", "change", ledger["jobrun"].pk)).content.decode()
    assert "won the slot" in page


def test_lease_held_is_decided_on_the_database_clock(admin_client, ledger):
    LeaseFactory(name="old", holder="node-b", expires_at=timezone.now() - timedelta(seconds=1))
    LeaseFactory(name="never", holder="")
    held = {lease.name: bool(lease.is_held) for lease in rows(admin_client.get(url("lease")))}
    assert held == {"leader": True, "old": False, "never": False}


# -- text --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "text"),
    [("*/5 * * * * *", "Every 5 seconds"),  # six fields: seconds first
     ("30 0 9 * * *", "At 09:00:30"),
     ("0 9 * * mon-fri", "At 09:00, Monday through Friday"),
     ("not cron", "not cron")],
)  # fmt: skip
def test_describe_cron(expr, text):
    assert describe_cron(expr) == text


@pytest.mark.parametrize(
    ("interval", "text"),
    [(timedelta(hours=1, minutes=30), "1 h 30 min"), (timedelta(milliseconds=250), "250 ms"),
     (timedelta(days=2, seconds=5), "2 d 5 s"), (timedelta(0), "0 ms")],
)  # fmt: skip
def test_interval_text(interval, text):
    assert interval_text(interval) == text


def test_fire_times_table_falls_back_to_utc_for_an_unknown_zone():
    table = fire_times_table([datetime(2026, 5, 28, 7, tzinfo=UTC)], "Mars/Base")
    assert table.count("2026-05-28 07:00:00 UTC") == 2


def test_node_list_shows_heartbeat_age_from_the_database_clock(admin_client):
    WorkerNodeFactory(node_id="stale", last_heartbeat=timezone.now() - timedelta(minutes=3))
    page = admin_client.get(url("workernode")).content.decode()
    assert "3 min" in page

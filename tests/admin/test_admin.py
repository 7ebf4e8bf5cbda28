"""The admin: every page loads, the ledger is read-only, and operators change only what they may."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django import forms
from django.contrib.admin import site
from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_cluster_jobs.admin import CODE_OWNED, describe_cron, fire_times_table, interval_text
from django_cluster_jobs.admin.jobs import JobDefinitionAdmin
from django_cluster_jobs.models import (
    ClusterEvent,
    ClusterEventKind,
    EventKind,
    JobDefinition,
    JobRun,
    Lease,
    NodeStatus,
    Outcome,
    RunState,
    ScheduleKind,
    Source,
    WorkerNode,
)
from django_cluster_jobs.registry import registry
from django_cluster_jobs.services import FOREVER
from tests.admin.pages import url
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
    lease = LeaseFactory(name="leader", holder="node-a", fence=4, acquired_at=timezone.now(),
                         expires_at=timezone.now() + timedelta(seconds=30))  # fmt: skip
    event = ClusterEvent.objects.create(at=timezone.now(), kind=ClusterEventKind.LEADER_ACQUIRED,
                                        node="node-a", fence=4, detail="became leader")  # fmt: skip
    return {"jobdefinition": job, "jobrun": run, "workernode": node, "lease": lease,
            "runevent": run.events.first(), "clusterevent": event}  # fmt: skip


@pytest.fixture
def viewer(staff):
    """A staff user who may view every ledger model but holds neither trigger nor manage."""
    return staff()


# -- every page loads --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model", ["jobdefinition", "jobrun", "runevent", "workernode", "lease", "clusterevent"]
)
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
    # The next five, in their own row (the row after it previews the next DST change).
    row = page[page.index("field-next_fire_times") : page.index("field-across_dst")]
    assert row.count("09:00:00 CE") == 5  # CET or CEST, whatever the season
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


NIGHTLY = {"name": "nightly", "callable_name": "tests.manual", "schedule_kind": "cron",
           "cron": "0 2 * * *", "timezone": "UTC"}  # fmt: skip


def form_data(client, path: str, **overrides: object) -> dict:
    """What a browser posts from the form at ``path``: its current values, with ``overrides``.

    An override of None leaves the field out (an unticked checkbox)."""
    form = client.get(path).context["adminform"].form
    data: dict[str, object] = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if isinstance(field, forms.BooleanField):
            value = "on" if value else None
        data[name] = value
    return {k: v for k, v in {**data, **overrides}.items() if v is not None}


def add_job(client, **overrides: object):
    return client.post(
        url("jobdefinition", "add"),
        form_data(client, url("jobdefinition", "add"), **{**NIGHTLY, **overrides}),
    )


def test_database_job_is_created_from_the_admin(admin_client):
    response = add_job(admin_client, payload='{"value": 3}', timezone="Europe/Paris")
    assert response.status_code == 302
    job = JobDefinition.objects.get(name="nightly")
    assert (job.source, job.payload, job.timezone) == (
        Source.DATABASE,
        {"value": 3},
        "Europe/Paris",
    )
    assert job.get_schedule().next_after(timezone.now()) is not None


def test_job_form_offers_registered_jobs_and_zones_as_choices(admin_client):
    page = admin_client.get(url("jobdefinition", "add")).content.decode()
    assert '<select name="callable_name"' in page and '<option value="tests.manual">' in page
    assert '<select name="timezone"' in page and '<option value="Europe/Paris">' in page


def test_a_stored_callable_whose_code_is_gone_is_shown_and_refused(admin_client):
    job = JobDefinitionFactory(callable_name="gone.job")
    path = url("jobdefinition", "change", job.pk)
    assert "gone.job (not registered)" in admin_client.get(path).content.decode()
    response = admin_client.post(path, form_data(admin_client, path))
    assert "No job named 'gone.job'" in " ".join(
        response.context["adminform"].form.errors["callable_name"]
    )


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [({"callable_name": "nope"}, "callable_name", "No job named 'nope'"),
     ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
     ({"cron": ""}, "cron", "this one has 0"),
     ({"timezone": "Mars/Base"}, "timezone", "not an IANA time zone"),
     ({"schedule_kind": "every", "cron": ""}, "interval", "needs an interval"),
     ({"schedule_kind": "delay", "interval": "-00:00:05"}, "interval", "must be positive"),
     ({"payload": "[1, 2]"}, "payload", "must be a JSON object"),
     ({"payload": "3"}, "payload", "must be a JSON object"),
     ({"payload": "{nope"}, "payload", "Enter a valid JSON"),
     ({"payload": '{"valeu": 3}'}, "payload", "unexpected keyword argument 'valeu'"),
     ({"requires": '["gpu", 1]'}, "requires", "as strings"),
     ({"name": "tests.manual"}, "name", "declared in code")],
)  # fmt: skip
def test_database_job_form_refuses_what_the_scheduler_cannot_use(
    admin_client, overrides, field, says
):
    response = add_job(admin_client, **overrides)
    assert response.status_code == 200
    assert says in " ".join(response.context["adminform"].form.errors[field])
    assert not JobDefinition.objects.exists()


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
     ("node=node-b", {"k-manual"}), ("q=k-failed", {"k-failed"}), ("q=other", {"k-manual"}),
     ("q=node-b", {"k-manual"}), ("queue=reports", {"k-manual"}),
     ("scheduled_at__year=2025", {"k-old"})],
)  # fmt: skip
def test_run_filters_and_search(admin_client, query, keys):
    other = JobDefinitionFactory(name="other", queue="reports")
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


def test_viewer_sees_the_run_timeline(viewer, ledger):
    page = viewer.get(url("jobrun", "change", ledger["jobrun"].pk)).content.decode()
    assert "won the slot" in page


def test_lease_held_is_decided_on_the_database_clock(admin_client, ledger):
    LeaseFactory(name="old", holder="node-b", expires_at=timezone.now() - timedelta(seconds=1))
    LeaseFactory(name="never", holder="")
    held = {lease.name: bool(lease.is_held) for lease in rows(admin_client.get(url("lease")))}
    assert held == {"leader": True, "old": False, "never": False}


# -- operator actions and their permissions ----------------------------------------------------

TRIGGER, MANAGE = "trigger_jobdefinition", "manage_jobdefinition"


def pending_manual_run(job) -> bool:
    return JobRun.objects.filter(job=job, outcome=Outcome.MANUAL, state=RunState.PENDING).exists()


def fresh(obj):
    obj.refresh_from_db()
    return obj


#: action → (model, permission, make the object it acts on, has it acted?)
ACTIONS = {
    "run_now": ("jobdefinition", TRIGGER, JobDefinitionFactory, pending_manual_run),
    "pause_jobs": ("jobdefinition", MANAGE, JobDefinitionFactory,
                   lambda job: fresh(job).paused_until == FOREVER),
    "resume_jobs": ("jobdefinition", MANAGE,
                    lambda: JobDefinitionFactory(paused_until=FOREVER, pause_reason="breaker"),
                    lambda job: fresh(job).paused_until is None),
    "enable_jobs": ("jobdefinition", MANAGE, lambda: JobDefinitionFactory(enabled=False),
                    lambda job: fresh(job).enabled),
    "disable_jobs": ("jobdefinition", MANAGE, JobDefinitionFactory,
                     lambda job: not fresh(job).enabled),
    "cancel_runs": ("jobrun", MANAGE, RunningRunFactory,
                    lambda run: fresh(run).cancel_requested),
    "replay_runs": ("jobrun", TRIGGER, lambda: JobRunFactory(state=RunState.DEAD),
                    lambda run: JobRun.objects.filter(origin=run).exists()),
    "drain": ("workernode", MANAGE, WorkerNodeFactory,
              lambda node: fresh(node).status == NodeStatus.DRAINING),
}  # fmt: skip


def act(client, model: str, action: str, *objs, **extra: str):
    """Post ``action`` on ``objs`` from the changelist, as its action form does."""
    data = {"action": action, "_selected_action": [o.pk for o in objs], "index": "0", **extra}
    return client.post(url(model), data, follow=True)


def log_of(obj) -> list[str]:
    ct = ContentType.objects.get_for_model(obj)
    entries = LogEntry.objects.filter(content_type=ct, object_id=str(obj.pk))
    return [f"{e.user.username}: {e.change_message}" for e in entries]


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_is_neither_offered_nor_run_without_its_permission(staff, action):
    model, needed, make, acted = ACTIONS[action]
    other = MANAGE if needed == TRIGGER else TRIGGER
    client = staff(other)  # may view everything and do the other kind of action
    obj = make()
    assert f'value="{action}"' not in client.get(url(model)).content.decode()
    response = act(client, model, action, obj, apply="1")
    assert response.status_code == 200
    assert not acted(obj)
    assert log_of(obj) == []


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_runs_with_its_permission_and_is_logged(staff, action):
    model, needed, make, acted = ACTIONS[action]
    client = staff(needed)
    obj = make()
    assert f'value="{action}"' in client.get(url(model)).content.decode()
    response = act(client, model, action, obj, apply="1")
    assert response.redirect_chain[-1][0] == url(model)
    assert acted(obj)
    assert len(log_of(obj)) == 1 and log_of(obj)[0].startswith("operator: ")
    assert 'class="success"' in response.content.decode()


def test_a_superuser_may_do_every_action(admin_client):
    for action, (model, _needed, make, acted) in ACTIONS.items():
        obj = make()
        act(admin_client, model, action, obj, apply="1")
        assert acted(obj), action


def test_run_now_queues_a_manual_run_that_names_who_triggered_it(admin_client):
    job = JobDefinitionFactory(name="report", payload={"value": 2})
    page = act(admin_client, "jobdefinition", "run_now", job).content.decode()
    run = JobRun.objects.get(job=job)
    assert (run.state, run.outcome, run.payload) == (RunState.PENDING, Outcome.MANUAL, {})
    assert run.reason == "triggered by admin:admin"
    assert "1 run queued" in page
    assert log_of(job) == [f"admin: Run now: queued run {run.pk}."]


def test_run_now_refuses_a_job_whose_code_is_not_registered(admin_client):
    job = JobDefinitionFactory(callable_name="gone.job")
    page = act(admin_client, "jobdefinition", "run_now", job).content.decode()
    assert not JobRun.objects.exists() and log_of(job) == []
    assert "no registered code for gone.job" in page


def test_pause_asks_how_long_and_why_then_shows_it_in_the_list(admin_client):
    job = JobDefinitionFactory(name="report")
    page = act(admin_client, "jobdefinition", "pause_jobs", job).content.decode()
    assert "Pause jobs" in page and "for 1 hour" in page and "report" in page
    assert fresh(job).paused_until is None  # nothing happens before the form is sent
    before = timezone.now()
    act(admin_client, "jobdefinition", "pause_jobs", job, apply="1", duration="3600",
        reason="database upgrade")  # fmt: skip
    job = fresh(job)
    assert before + timedelta(hours=1) <= job.paused_until <= timezone.now() + timedelta(hours=1)
    assert job.pause_reason == "database upgrade (paused by admin:admin)"
    assert job.updated_at >= before  # nodes re-plan when updated_at moves
    column = admin_client.get(url("jobdefinition")).content.decode()
    assert '<td class="field-paused">until ' in column
    assert ": database upgrade (paused by admin:admin)</td>" in column
    assert log_of(job)[0].startswith("admin: Paused until ")


def test_paused_column_and_filter_show_breaker_and_open_ended_pauses(admin_client):
    JobDefinitionFactory(name="tripped", pause_reason="circuit breaker: 5 failures",
                         paused_until=timezone.now() + timedelta(minutes=5))  # fmt: skip
    JobDefinitionFactory(name="held", paused_until=FOREVER, pause_reason="paused by admin")
    JobDefinitionFactory(name="over", paused_until=timezone.now() - timedelta(minutes=1))
    response = admin_client.get(f"{url('jobdefinition')}?paused=yes")
    assert {job.name for job in rows(response)} == {"tripped", "held"}
    page = response.content.decode()
    assert ": circuit breaker: 5 failures</td>" in page
    assert "until resumed: paused by admin" in page
    no = admin_client.get(f"{url('jobdefinition')}?paused=no")
    assert {job.name for job in rows(no)} == {"over"}


def test_pause_is_not_editable_in_the_form(admin_client):
    job = JobDefinitionFactory(paused_until=FOREVER, pause_reason="breaker")
    page = admin_client.get(url("jobdefinition", "change", job.pk)).content.decode()
    assert 'name="paused_until"' not in page and 'name="pause_reason"' not in page
    assert "until resumed: breaker" in page


def test_cancel_touches_only_running_runs_and_replay_only_finished_ones(admin_client):
    pending = JobRunFactory(state=RunState.PENDING)
    page = act(admin_client, "jobrun", "cancel_runs", pending).content.decode()
    assert "only running runs" in page and not fresh(pending).cancel_requested
    page = act(admin_client, "jobrun", "replay_runs", pending).content.decode()
    assert "only finished runs" in page and JobRun.objects.count() == 1
    assert log_of(pending) == []


def test_cancel_reaches_the_run_timeline(admin_client):
    run = RunningRunFactory(fence=3)
    act(admin_client, "jobrun", "cancel_runs", run)
    event = run.events.get(kind=EventKind.CANCEL_REQUESTED)
    assert (event.node, event.fence) == ("admin:admin", 3)


def test_replay_creates_a_fresh_pending_run_linked_to_the_original(admin_client):
    dead = JobRunFactory(state=RunState.DEAD, payload={"value": 4}, error="boom")
    act(admin_client, "jobrun", "replay_runs", dead)
    replay = JobRun.objects.get(origin=dead)
    assert (replay.state, replay.outcome, replay.payload) == ("pending", "replay", {"value": 4})
    assert replay.key != dead.key and fresh(dead).state == RunState.DEAD
    assert log_of(dead) == [f"admin: Replayed as run {replay.pk}."]
    assert dead.events.filter(kind=EventKind.REPLAYED, node="admin:admin").exists()


def test_drain_leaves_nodes_that_are_not_active_alone(admin_client):
    active = WorkerNodeFactory(status=NodeStatus.ACTIVE)
    stopped = WorkerNodeFactory(status=NodeStatus.STOPPED)
    page = act(admin_client, "workernode", "drain", active, stopped).content.decode()
    statuses = dict(WorkerNode.objects.values_list("pk", "status"))
    assert statuses == {active.pk: NodeStatus.DRAINING, stopped.pk: NodeStatus.STOPPED}
    assert "1 node will drain" in page and log_of(stopped) == []


# -- actions on an object's page ---------------------------------------------------------------


def buttons(client, model: str, obj) -> set[str]:
    page = client.get(url(model, "change", obj.pk)).content.decode()
    return set(re.findall(r'name="object_action" value="(\w+)"', page))


def test_object_pages_offer_the_actions_that_apply(admin_client):
    job = JobDefinitionFactory()
    paused = JobDefinitionFactory(paused_until=FOREVER)
    assert buttons(admin_client, "jobdefinition", job) == {"run_now", "pause_jobs"}
    assert buttons(admin_client, "jobdefinition", paused) == {"run_now", "resume_jobs"}
    assert buttons(admin_client, "jobrun", RunningRunFactory()) == {"cancel_runs"}
    assert buttons(admin_client, "jobrun", JobRunFactory(state="failed")) == {"replay_runs"}
    assert buttons(admin_client, "workernode", WorkerNodeFactory()) == {"drain"}
    stopped = WorkerNodeFactory(status=NodeStatus.STOPPED)
    assert buttons(admin_client, "workernode", stopped) == set()


def test_object_pages_offer_only_what_the_user_may_do(staff):
    client = staff(TRIGGER)
    assert buttons(client, "jobdefinition", JobDefinitionFactory()) == {"run_now"}
    assert buttons(client, "jobrun", RunningRunFactory()) == set()


def test_an_object_page_action_comes_back_to_the_page(admin_client):
    job = JobDefinitionFactory()
    data = {"action": "run_now", "_selected_action": job.pk, "_from_object": "1"}
    response = admin_client.post(url("jobdefinition"), data)
    assert response.status_code == 302
    assert response["Location"] == url("jobdefinition", "change", job.pk)
    assert pending_manual_run(job)
    pause = admin_client.post(url("jobdefinition"), {**data, "action": "pause_jobs"})
    assert 'name="_from_object"' in pause.content.decode()  # the pause form keeps the way back


def test_job_page_counts_runs_by_state_over_the_last_day_in_one_query(
    admin_client, django_assert_num_queries
):
    job = JobDefinitionFactory(name="report")
    now = timezone.now()
    JobRunFactory.create_batch(2, job=job, state=RunState.SUCCEEDED)
    JobRunFactory(job=job, state=RunState.DEAD, scheduled_at=now - timedelta(hours=23))
    JobRunFactory(job=job, state=RunState.FAILED, scheduled_at=now - timedelta(hours=25))
    JobRunFactory(state=RunState.FAILED)  # another job's
    with django_assert_num_queries(1):
        text = JobDefinitionAdmin(JobDefinition, site).runs_last_day(job)
    assert re.findall(r">([\w -]+: \d+)<", text) == ["succeeded: 2", "dead-lettered: 1"]
    link = re.search(r'href="([^"]+)">succeeded', text).group(1).replace("&amp;", "&")
    assert {run.job_id for run in rows(admin_client.get(link))} == {job.pk}
    assert len(rows(admin_client.get(link))) == 2
    page = admin_client.get(url("jobdefinition", "change", job.pk)).content.decode()
    assert "runs in the last 24 hours" in page.lower() and "succeeded: 2" in page


# -- the leader and the cluster's events -------------------------------------------------------


def test_node_list_marks_the_leader_with_its_fence_and_since_when(admin_client, ledger):
    WorkerNodeFactory(node_id="node-b")
    response = admin_client.get(url("workernode"))
    fences = {node.node_id: node.leader_fence for node in rows(response)}
    assert fences == {"node-a": 4, "node-b": None}
    page = response.content.decode()
    assert page.count("leader since") == 1 and "fence 4</strong>" in page
    assert "Leader: <strong>node-a</strong> since" in page and "fencing token 4" in page


def test_node_list_says_when_no_node_leads(admin_client, ledger):
    Lease.objects.filter(name="leader").update(expires_at=timezone.now() - timedelta(seconds=1))
    response = admin_client.get(url("workernode"))
    assert {node.leader_fence for node in rows(response)} == {None}
    assert "No node holds the leader lease" in response.content.decode()


def test_node_page_shows_whether_it_leads(admin_client, ledger):
    page = admin_client.get(url("workernode", "change", ledger["workernode"].pk)).content.decode()
    assert "leader since" in page


def test_cluster_events_are_read_only(admin_client, ledger):
    event = ledger["clusterevent"]
    assert admin_client.get(url("clusterevent", "add")).status_code == 403
    change = url("clusterevent", "change", event.pk)
    assert admin_client.post(change, {"kind": "node_dead"}).status_code == 403
    assert admin_client.get(url("clusterevent", "delete", event.pk)).status_code == 403
    page = admin_client.get(change).content.decode()
    assert 'name="_save"' not in page and "deletelink" not in page
    assert fresh(event).kind == ClusterEventKind.LEADER_ACQUIRED


@pytest.mark.parametrize(
    ("query", "details"),
    [("kind__exact=node_dead", {"buried"}), ("node=node-b", {"buried"}),
     ("at__year=2025", {"old"}), ("q=became", {"became leader"}),
     ("", {"became leader", "buried", "old"})],
)  # fmt: skip
def test_cluster_event_filters(admin_client, ledger, query, details):
    WorkerNodeFactory(node_id="node-b")
    ClusterEvent.objects.create(at=timezone.now(), kind="node_dead", node="node-b", detail="buried")
    ClusterEvent.objects.create(at=datetime(2025, 6, 1, tzinfo=UTC), kind="reaped", detail="old")
    response = admin_client.get(f"{url('clusterevent')}?{query}")
    assert {event.detail for event in rows(response)} == details


def test_viewer_sees_cluster_events(viewer, ledger):
    assert "became leader" in viewer.get(url("clusterevent")).content.decode()


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


def test_a_job_paused_until_resumed_has_no_next_fire_time(admin_client):
    from django_cluster_jobs import services
    from django_cluster_jobs.status import build_status

    JobDefinitionFactory(name="monthly", cron="0 0 1 * *")
    services.pause("monthly")
    assert admin_client.get(url("jobdefinition")).status_code == 200
    [job] = [j for j in build_status()["jobs"] if j["name"] == "monthly"]
    assert job["paused"] and job["next_fire_time"] is None

"""The admin's view of dependencies: a workflow instance drawn as a graph, and each job's
predecessors and dependents on its page."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from django_cluster_jobs import services
from django_cluster_jobs.models import JobDefinition, JobRun, Outcome, RunState
from tests.admin.pages import page, url

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)


def run_of(name: str, state: str, instance: int | None = None, key: str = "") -> JobRun:
    return JobRun.objects.create(
        job=services.definition_for(name), key=key or f"{name}:{instance}", scheduled_at=NOW,
        due_at=NOW, state=state, created_at=NOW, instance=instance,
        outcome=Outcome.AFTER if instance else Outcome.WON,
    )  # fmt: skip


@pytest.fixture
def instance():
    root = run_of("tests.flow_root", RunState.SUCCEEDED, key="root")
    run_of("tests.flow_b", RunState.SUCCEEDED, root.pk)
    run_of("tests.flow_c", RunState.DEAD, root.pk)
    run_of("tests.flow_d", RunState.SKIPPED, root.pk)
    return root


def states_drawn(html: str) -> dict[str, str]:
    return dict(re.findall(r'<g class="[^"]*" data-job="([^"]+)" data-state="([^"]+)">', html))


def test_the_instance_page_draws_each_job_in_its_state(admin_client, instance):
    html = page(admin_client, reverse("admin:cluster_jobs_instance", args=[instance.pk]))
    assert "<svg" in html and html.count("<line") == 4  # root->b, root->c, b->d, c->d
    assert states_drawn(html) == {
        "tests.flow_root": "succeeded", "tests.flow_b": "succeeded",
        "tests.flow_c": "dead", "tests.flow_d": "skipped",
    }  # fmt: skip
    assert "http" not in re.sub(r'href="[^"]*"', "", html.split("<svg", 1)[1].split("</svg>")[0])


def test_the_page_of_any_run_of_the_instance_links_to_it(admin_client, instance):
    d = JobRun.objects.get(job__name="tests.flow_d")
    html = page(admin_client, url("jobrun", "change", d.pk))
    assert f"instance {instance.pk} (failed)" in html


def test_a_job_in_no_workflow_has_no_instance_page(admin_client):
    lone = run_of("tests.manual", RunState.SUCCEEDED, key="lone")
    response = admin_client.get(reverse("admin:cluster_jobs_instance", args=[lone.pk]))
    assert response.status_code == 404


def test_the_job_page_lists_its_predecessors_and_dependents(admin_client):
    job = services.definition_for("tests.flow_b")
    services.definition_for("tests.flow_root"), services.definition_for("tests.flow_d")
    html = page(admin_client, url("jobdefinition", "change", job.pk))
    runs_after = html.split("Runs after", 1)[1].split("</p>", 1)[0]
    runs_before = html.split("Runs before", 1)[1].split("</p>", 1)[0]
    assert ">tests.flow_root</a>" in runs_after
    assert ">tests.flow_d</a>" in runs_before


@pytest.mark.parametrize(
    ("after", "says"),
    [('["tests.flow_d", "db.nowhere"]', "no job named 'db.nowhere'"),
     ('["tests.flow_d"]', None),
     ('"tests.flow_d"', "list the names of the jobs")],
)  # fmt: skip
def test_the_job_form_refuses_an_unknown_predecessor_through_the_one_validator(
    admin_client, after, says
):
    from tests.admin.test_admin import add_job

    services.definition_for("tests.flow_d")
    response = add_job(admin_client, schedule_kind="on_demand", cron="", after=after)
    if says is None:
        assert response.status_code == 302
        assert JobDefinition.objects.get(name="nightly").after == ["tests.flow_d"]
    else:
        assert says in " ".join(response.context["adminform"].form.errors["after"])


def test_the_job_form_refuses_a_cycle_through_the_job_naming_its_path(admin_client):
    from tests.admin.test_admin import add_job

    JobDefinition.objects.create(name="db.first", callable_name="tests.manual", after=["nightly"])
    response = add_job(admin_client, schedule_kind="on_demand", cron="", after='["db.first"]')
    errors = " ".join(response.context["adminform"].form.errors["after"])
    assert "nightly -> db.first -> nightly" in errors or "db.first -> nightly -> db.first" in errors


def test_deleting_a_job_others_wait_for_names_them_and_stops_nothing(admin_client):
    """A predecessor deleted in the admin: the operator is told which jobs wait for it, before
    and after; each dependent's page says why it is no longer queued; the checks warn (W007)
    and `check --database` (as `migrate` runs it) still passes."""
    from django.core.management import call_command

    from django_cluster_jobs.checks import check_stored_dependencies

    extract = JobDefinition.objects.create(name="db.extract", callable_name="tests.manual")
    JobDefinition.objects.create(name="db.load", callable_name="tests.manual",
                                 after=["db.extract"])  # fmt: skip
    JobDefinition.objects.create(name="db.report", callable_name="tests.manual",
                                 after=["db.load", "db.extract"])  # fmt: skip
    html = page(admin_client, url("jobdefinition", "delete", extract.pk))
    assert "Jobs that wait for db.extract: db.load, db.report. Once it is deleted" in html
    response = admin_client.post(url("jobdefinition", "delete", extract.pk), {"post": "yes"},
                                 follow=True)  # fmt: skip
    assert response.status_code == 200
    assert "Jobs that waited for db.extract: db.load, db.report. They are no longer" in (
        response.content.decode()
    )
    assert not JobDefinition.objects.filter(name="db.extract").exists()
    load = JobDefinition.objects.get(name="db.load")
    html = page(admin_client, url("jobdefinition", "change", load.pk))
    assert "no job named &#x27;db.extract&#x27; is declared or stored" in html
    assert "db.extract (unknown: never queued after it)" in html
    assert {m.id for m in check_stored_dependencies()} == {"cluster_jobs.W007"}
    call_command("check", "--database", "default")  # a SystemCheckError would fail the test


def test_deleting_a_job_no_one_waits_for_warns_of_nothing(admin_client):
    lone = JobDefinition.objects.create(name="db.lone", callable_name="tests.manual")
    html = page(admin_client, url("jobdefinition", "delete", lone.pk))
    assert "Jobs that wait for" not in html

"""A task's run in the admin: listed under its job, with its path and arguments."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests import task_defs

pytestmark = pytest.mark.django_db


def test_the_admin_shows_a_task_run_with_its_path_and_arguments(admin_client):
    result = task_defs.echo.enqueue("hello", n=3)
    listing = admin_client.get(reverse("admin:cluster_jobs_jobrun_changelist"))
    assert listing.status_code == 200
    assert [run.pk for run in listing.context["cl"].result_list] == [int(result.id)]
    assert "tests.task_defs.echo" in listing.content.decode()
    page = admin_client.get(reverse("admin:cluster_jobs_jobrun_change", args=[int(result.id)]))
    text = page.content.decode()
    assert page.status_code == 200
    assert "tests.task_defs.echo" in text
    assert "&quot;hello&quot;" in text and "&quot;n&quot;: 3" in text
    job = admin_client.get(reverse("admin:cluster_jobs_jobdefinition_changelist"))
    assert "tests.task_defs.echo" in job.content.decode()

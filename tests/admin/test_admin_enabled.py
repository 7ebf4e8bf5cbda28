"""Switching a job on or off in the admin needs the manage permission, as the actions do: the
``enabled`` box of the job list and of the job's form are read-only without it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from django_cluster_jobs.models import Source
from tests.admin.pages import page, url
from tests.factories import JobDefinitionFactory

pytestmark = pytest.mark.django_db


def staff_client(client, *codenames: str):
    user = User.objects.create_user(f"op{User.objects.count()}", is_staff=True)
    perms = Permission.objects.filter(codename__in=("view_jobdefinition", *codenames))
    user.user_permissions.set(perms)
    client.force_login(user)
    return client


def list_post(job, enabled: bool) -> dict:
    data = {"form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-0-id": str(job.pk),
            "_save": "Save"}  # fmt: skip
    return {**data, "form-0-enabled": "on"} if enabled else data


def test_enabled_is_read_only_in_the_list_without_manage(client):
    job = JobDefinitionFactory(name="listed", source=Source.CODE)
    editor = staff_client(client, "change_jobdefinition")
    assert 'name="form-0-enabled"' not in page(editor, url("jobdefinition"))
    editor.post(url("jobdefinition"), list_post(job, enabled=False))
    job.refresh_from_db()
    assert job.enabled is True


def test_enabled_is_editable_in_the_list_with_manage(client):
    job = JobDefinitionFactory(name="listed", source=Source.CODE)
    manager = staff_client(client, "change_jobdefinition", "manage_jobdefinition")
    assert 'name="form-0-enabled"' in page(manager, url("jobdefinition"))
    assert manager.post(url("jobdefinition"), list_post(job, enabled=False)).status_code == 302
    job.refresh_from_db()
    assert job.enabled is False


@pytest.mark.parametrize("source", [Source.CODE, Source.DATABASE])
def test_enabled_is_read_only_on_the_form_without_manage(client, source):
    job = JobDefinitionFactory(name="formed", source=source)
    editor = staff_client(client, "change_jobdefinition")
    path = url("jobdefinition", "change", job.pk)
    assert 'name="enabled"' not in page(editor, path)
    form = editor.get(path).context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    editor.post(path, {**{k: v for k, v in data.items() if v is not None}, "enabled": ""})
    job.refresh_from_db()
    assert job.enabled is True


def test_enabled_is_editable_on_the_form_with_manage(client):
    job = JobDefinitionFactory(name="formed", source=Source.CODE)
    manager = staff_client(client, "change_jobdefinition", "manage_jobdefinition")
    assert 'name="enabled"' in page(manager, url("jobdefinition", "change", job.pk))

"""The backend's system checks: the exact messages, hints and ids."""

from __future__ import annotations

from types import SimpleNamespace

import django
import pytest
from django.core import checks

from django_cluster_jobs.checks import check_tasks
from django_cluster_jobs.tasks import ClusterJobsBackend
from django_cluster_jobs.tasks import checks as task_checks

BACKEND = "django_cluster_jobs.tasks.ClusterJobsBackend"
OURS = {"default": {"BACKEND": BACKEND}, "other": {"BACKEND": "x.Immediate"}}


def with_settings(monkeypatch, **values) -> None:
    monkeypatch.setattr(task_checks, "settings", SimpleNamespace(**values))


def test_the_project_settings_pass():
    assert check_tasks() == []


def test_no_tasks_setting_or_another_backend_is_not_our_business(monkeypatch):
    with_settings(monkeypatch, INSTALLED_APPS=[])
    assert check_tasks() == []
    with_settings(monkeypatch, TASKS={"default": {"BACKEND": "x.Immediate"}}, INSTALLED_APPS=[])
    assert check_tasks() == []


def test_e020_without_any_django_tasks_api(monkeypatch):
    with_settings(monkeypatch, TASKS=OURS, INSTALLED_APPS=[])
    monkeypatch.setattr(task_checks, "api", lambda: None)
    assert check_tasks() == [
        checks.Error(
            f"TASKS['default'] uses {BACKEND}, but Django {django.get_version()} has no "
            "django.tasks and the django-tasks backport is not installed.",
            hint="Install the backport with pip install 'django-cluster-jobs[tasks]' and add "
            "'django_tasks' to INSTALLED_APPS, or upgrade to Django 6.0 or later.",
            id="cluster_jobs.E020",
        )
    ]


def test_e022_the_backport_is_not_an_installed_app(monkeypatch):
    with_settings(monkeypatch, TASKS=OURS, INSTALLED_APPS=["django_cluster_jobs"])
    monkeypatch.setattr(task_checks, "api", lambda: "django_tasks")
    assert check_tasks() == [
        checks.Error(
            f"TASKS['default'] uses {BACKEND} through the django-tasks backport, which is not "
            "in INSTALLED_APPS, so its checks (and this backend's) never run.",
            hint="Add 'django_tasks' to INSTALLED_APPS.",
            id="cluster_jobs.E022",
        )
    ]
    monkeypatch.setattr(task_checks, "api", lambda: "django.tasks")  # Django 6: no app needed
    assert check_tasks() == []


@pytest.mark.parametrize(
    ("options", "message", "hint"),
    [
        (
            {"RETRIES": 3},
            "TASKS['bad']: OPTIONS {'RETRIES': 3} is not usable.",
            "unknown key(s) RETRIES; valid: MAX_ATTEMPTS, BACKOFF, TIMEOUT, DELIVERY",
        ),
        (
            {"MAX_ATTEMPTS": 0},
            "TASKS['bad']: OPTIONS['MAX_ATTEMPTS'] 0 is not usable.",
            "use a whole number, 1 or more, at most 100",
        ),
    ],
)
def test_e021_options_the_ledger_cannot_use(options, message, hint):
    backend = ClusterJobsBackend("bad", {"OPTIONS": options})
    assert backend.check() == [checks.Error(message, hint=hint, id="cluster_jobs.E021")]


def test_good_options_become_the_policies_of_every_task():
    backend = ClusterJobsBackend(
        "good", {"OPTIONS": {"MAX_ATTEMPTS": 3, "TIMEOUT": 30, "BACKOFF": {"kind": "fixed"}}}
    )
    assert backend.check() == []
    assert backend.policies["max_attempts"] == 3
    assert backend.policies["timeout"].total_seconds() == 30


def test_e020_for_real_without_any_api_and_the_app_still_loads():
    """A process where neither django.tasks nor the backport can be imported: the app loads,
    jobs work, and ``manage.py check`` fails with E020."""
    import subprocess
    import sys

    from tests import timing
    from tests.conftest import ROOT

    code = (
        "import sys; sys.modules['django.tasks'] = None; sys.modules['django_tasks'] = None\n"
        "import django; django.setup()\n"
        "from django.core.management import call_command\n"
        "call_command('check')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
        timeout=timing.NODE_START,  # a hang guard: it sets Django up and checks, as a node starts
        env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "cluster_jobs.E020" in done.stderr and "django-cluster-jobs[tasks]" in done.stderr
    assert "cluster_jobs.E0" not in done.stderr.replace("cluster_jobs.E020", "")

"""System checks of the django.tasks backend: the API it needs, and where the backport is an app.

Registered from ``django_cluster_jobs.checks``; the backend's own ``check()`` reports its
OPTIONS (``cluster_jobs.E021``) where Django runs backends' checks.
"""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings
from django.core import checks

BACKEND = "django_cluster_jobs.tasks.ClusterJobsBackend"


def aliases() -> list[str]:
    """The TASKS aliases whose BACKEND is this package's backend."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return []
    return [
        alias
        for alias, entry in configured.items()
        if isinstance(entry, dict) and entry.get("BACKEND") == BACKEND
    ]


def api() -> str | None:
    """Where the django.tasks API comes from: ``django.tasks``, ``django_tasks`` or None."""
    try:
        from .compat import SOURCE
    except ImportError:
        return None
    return SOURCE


def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E020: no django.tasks API; E022: the backport is not an installed app."""
    ours = aliases()
    if not ours:
        return []
    named = ", ".join(f"TASKS[{alias!r}]" for alias in ours)
    source = api()
    if source is None:
        return [
            checks.Error(
                f"{named} uses {BACKEND}, but Django {django.get_version()} has no django.tasks "
                "and the django-tasks backport is not installed.",
                hint="Install the backport with pip install 'django-cluster-jobs[tasks]' and add "
                "'django_tasks' to INSTALLED_APPS, or upgrade to Django 6.0 or later.",
                id="cluster_jobs.E020",
            )
        ]
    if source == "django_tasks" and "django_tasks" not in settings.INSTALLED_APPS:
        return [
            checks.Error(
                f"{named} uses {BACKEND} through the django-tasks backport, which is not in "
                "INSTALLED_APPS, so its checks (and this backend's) never run.",
                hint="Add 'django_tasks' to INSTALLED_APPS.",
                id="cluster_jobs.E022",
            )
        ]
    return []

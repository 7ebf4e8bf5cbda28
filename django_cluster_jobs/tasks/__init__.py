"""The django.tasks backend: ``TASKS = {"default": {"BACKEND":
"django_cluster_jobs.tasks.ClusterJobsBackend"}}`` (Django 6.0+, or 5.2 with django-tasks).

The backend is imported on first use, so this package imports without either API installed.
"""

from typing import Any

from .commit import enqueue_on_commit

__all__ = ["ClusterJobsBackend", "ClusterTask", "enqueue_on_commit"]


def __getattr__(name: str) -> Any:
    if name in ("ClusterJobsBackend", "ClusterTask"):
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

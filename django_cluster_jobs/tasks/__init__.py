"""The django.tasks backend: ``TASKS = {"default": {"BACKEND":
"django_cluster_jobs.tasks.ClusterJobsBackend"}}`` (Django 6.0+, or 5.2 with django-tasks).

The backend is imported on first use, so this package imports without either API installed.
"""

from typing import Any

__all__ = ["ClusterJobsBackend", "ClusterTask"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

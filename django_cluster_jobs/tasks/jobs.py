"""A ``django.tasks`` task as a job of the registry: an on-demand job named by the task's path.

Each run of it is one enqueued task; the node takes, leases, fences, retries and dead-letters it
like any other run, and the handler below calls the task's function with the run's ``args`` and
``kwargs``. A node that never imported the task's module finds it through the registry's
resolver, which imports the path a stored definition names and accepts it only if it is a Task
of this backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.utils.module_loading import import_string

from .. import schedules, validation
from ..context import RunContext
from ..exceptions import ImproperlyDeclared
from ..registry import Job, registry

logger = logging.getLogger(__name__)

#: Names the resolver could not import: the admin and the checks ask about orphaned
#: definitions' names on every page and run, and a failed import searches the whole path.
NOT_IMPORTABLE: set[str] = set()


@dataclass(frozen=True)
class TaskJob(Job):
    """A job that runs a django.tasks Task."""

    task: Any = None


def job_for(task: Any) -> TaskJob:
    """Return the registered job of ``task`` (by its path), registering it the first time."""
    name = task.module_path
    known = registry._jobs.get(name)
    if isinstance(known, TaskJob):
        return known
    return registry.register(build(task))  # type: ignore[return-value]


def build(task: Any) -> TaskJob:
    """Return the job of a task, with the policies of its backend's OPTIONS and its decorator;
    raise ImproperlyDeclared naming the task, the option and the fix."""
    name = task.module_path
    policies = {**task.get_backend().policies, **decorator_policies(task)}
    values = {"name": name, "callable_name": name, "priority": task.priority,
              "queue": task.queue_name, **policies}  # fmt: skip
    if problems := validation.definition_errors(values, job=name):
        raise problems[0]
    return TaskJob(name=name, func=handler(task), schedule=schedules.OnDemand(),
                   priority=task.priority, queue=task.queue_name, task=task,
                   **policies)  # fmt: skip


def decorator_policies(task: Any) -> dict[str, Any]:
    """The retry and timeout options given to ``@task(...)`` (where Django passes them on)."""
    from .options import _value

    found = {key: getattr(task, key, None) for key in ("max_attempts", "backoff", "timeout")}
    return {key: _value(key, value) for key, value in found.items() if value is not None}


def handler(task: Any) -> Callable[..., Any]:
    """The job's handler: run the task of the run it is given; named after the task."""

    def run(context: RunContext, **payload: Any) -> Any:
        from .execute import execute

        return execute(task, context, payload)

    run.__module__, run.__qualname__ = task.func.__module__, task.func.__qualname__
    run.__name__ = task.func.__name__
    return run


def resolve(name: str) -> TaskJob | None:
    """The registry's resolver: the job of the task at dotted path ``name``, or None.

    Only paths inside an installed app are imported: a stored job name never makes a node
    import a module of another package.
    """
    if name in NOT_IMPORTABLE or not in_an_app(name):
        return None
    try:
        found = import_string(name)
    except Exception:  # not an importable path: not a task (and code does not change while
        NOT_IMPORTABLE.add(name)  # the process runs, so it is not tried again)
        return None
    if not is_ours(found):
        return None
    try:
        return build(found)
    except ImproperlyDeclared as exc:
        logger.error("task %s cannot run here: %s", name, exc, extra={"job": name})
        return None


def in_an_app(name: str) -> bool:
    """True when ``name`` is a dotted path inside the package of an installed app."""
    return "." in name and any(
        name.startswith(f"{config.name}.") for config in apps.get_app_configs()
    )


def is_ours(found: Any) -> bool:
    """True for a Task whose backend is a ClusterJobsBackend."""
    from .backend import ClusterJobsBackend
    from .compat import Task

    if not isinstance(found, Task):
        return False
    try:
        return isinstance(found.get_backend(), ClusterJobsBackend)
    except Exception:  # a backend alias no longer configured
        return False

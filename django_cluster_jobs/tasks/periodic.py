"""Periodic tasks: a django.tasks Task declared as a scheduled job of the cluster.

``schedule(send_digest, cron="0 3 * * *", tz="Europe/Paris", args=[7])`` in an app's
``jobs.py`` (autodiscovered by every node) makes each occurrence one run of the task, claimed
exactly once in the cluster like any job's, visible and pausable in the admin. The arguments
are the job's payload, so an operator sees and may change them; each run stores them with the
task's path, so ``get_result(run id)`` reads it like an enqueued task's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from .. import validation
from ..registry import Job, job, registry
from .jobs import TaskJob, handler, is_ours


def schedule(
    task: Any,
    *,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> TaskJob:
    """Declare ``task`` as a scheduled job; ``options`` are ``@job``'s (``cron=``, ``tz=``,
    ``every=``, ``delay=``, ``misfire=``, ``max_attempts=``, …). Returns the registered job.

    Its name is ``<task path>:schedule`` unless ``name`` is given (needed to schedule one task
    twice). Raises ImproperlyDeclared (InvalidPayload for the arguments) naming what to fix.
    """
    if not is_ours(task):
        raise TypeError(f"schedule() takes a Task of a ClusterJobsBackend, not {task!r}")
    label = name or f"{task.module_path}:schedule"
    stored_args, stored_kwargs = validation.check_task_inputs(
        label, args=args, kwargs=kwargs, priority=task.priority, queue=task.queue_name,
        queues=task.get_backend().queues,
    )  # fmt: skip
    options.setdefault("priority", task.priority)
    options.setdefault("queue", task.queue_name)
    for key, value in task.get_backend().policies.items():
        options.setdefault(key, value)
    payload = {"args": stored_args, "kwargs": stored_kwargs}
    declared = job(name=label, payload=payload, **options)(handler(task))
    scheduled = TaskJob(**{f.name: getattr(declared, f.name) for f in fields(Job)}, task=task)
    return registry.register(scheduled)  # type: ignore[return-value]

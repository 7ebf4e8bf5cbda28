"""The ``django.tasks`` API from Django 6.0+, or from the ``django-tasks`` backport on 5.2.

The only module of the package that knows where the API lives; importing it raises ImportError
when neither is installed (the system check ``cluster_jobs.E020`` says how to fix that).
"""

from __future__ import annotations

try:  # Django 6.0 and later
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    SOURCE = "django.tasks"
except ImportError:  # Django 5.2 with the backport
    from django_tasks import (  # type: ignore[no-redef,assignment,unused-ignore]
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef,assignment,unused-ignore]
    from django_tasks.base import Task, TaskError  # type: ignore[no-redef,assignment,unused-ignore]
    from django_tasks.exceptions import (  # type: ignore[no-redef,assignment,unused-ignore]
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import (  # type: ignore[no-redef,assignment,unused-ignore]
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django_tasks.signals import (  # type: ignore[no-redef,assignment,unused-ignore]
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json  # type: ignore[no-redef,assignment,unused-ignore]

    SOURCE = "django_tasks"

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME", "SOURCE", "BaseTaskBackend", "InvalidTask", "Task", "TaskContext",
    "TaskError", "TaskResult", "TaskResultDoesNotExist", "TaskResultMismatch", "TaskResultStatus",
    "normalize_json", "task_backends", "task_enqueued", "task_finished", "task_started",
]  # fmt: skip

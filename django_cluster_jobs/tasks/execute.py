"""Running a task on a node: its arguments from the run, ``task_started``, its return value."""

from __future__ import annotations

from inspect import iscoroutinefunction
from typing import Any

from ..conf import app_settings
from ..context import RunContext
from ..models import JobRun
from . import compat, running
from .results import result_of


def execute(task: Any, context: RunContext, payload: dict) -> Any:
    """Call the task's function with the run's args and kwargs; return its JSON return value
    (an awaitable for an async task, which the runner awaits).

    A run of a periodic task was claimed with its job's payload only: its arguments come from
    there and are stored on the run first. A return value that is not JSON raises TypeError, as
    in Django's own backends, and the run fails with it.
    """
    runs = JobRun.objects.using(app_settings.DATABASE)
    if payload:  # under the fence, and once: a retry's row already has them
        runs.filter(pk=context.run_id, fence=context.fence, task_path="").update(
            task_path=task.module_path,
            args=payload.get("args") or [],
            kwargs=payload.get("kwargs") or {},
        )
    run = runs.get(pk=context.run_id)
    running.put(run)
    started = result_of(run, task)
    backend = task.get_backend()
    compat.task_started.send(sender=type(backend), task_result=started)
    args = list(run.args or [])
    if task.takes_context:
        args.insert(0, compat.TaskContext(task_result=started))
    kwargs = run.kwargs or {}
    if iscoroutinefunction(task.func):
        return _acall(task.func, args, kwargs)
    return compat.normalize_json(task.func(*args, **kwargs))


async def _acall(func: Any, args: list, kwargs: dict) -> Any:
    return compat.normalize_json(await func(*args, **kwargs))

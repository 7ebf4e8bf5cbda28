"""``ClusterJobsBackend``: django.tasks on the ledger of django-cluster-jobs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core import checks

from .. import services, validation
from ..conf import app_settings
from ..exceptions import ClusterJobsError, ImproperlyDeclared
from ..models import JobRun
from . import compat
from .jobs import build, job_for
from .options import option_of, policies_from


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterTask(compat.Task):
    """A Task with the retry and timeout keywords of ``@task(...)`` (Django 6.1 and the backport
    pass the decorator's extra keywords to the backend's ``task_class``)."""

    max_attempts: int | None = None
    backoff: dict | None = None
    timeout: timedelta | None = None


class ClusterJobsBackend(compat.BaseTaskBackend):
    """Each enqueued task is a pending run of a job named by the task's path, taken and run by
    ``runscheduler`` nodes: leased, fenced, retried, dead-lettered and shown in the admin."""

    task_class = ClusterTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        #: The job policies OPTIONS ask for, and the problems found in them.
        self.policies, self.problems = policies_from(alias, self.options)
        #: The tasks (by repr: every field) whose declaration build() found runnable here.
        self._built: set[str] = set()

    def validate_task(self, task: Any) -> None:
        """Refuse what Django refuses, then what the ledger cannot run (InvalidTask)."""
        super().validate_task(task)
        if self.problems:
            raise compat.InvalidTask(str(self.problems[0]))
        try:
            validation.check_task_inputs(
                task.module_path, priority=task.priority, queue=task.queue_name,
                queues=self.queues, at=task.run_after,
            )  # fmt: skip
            self._build_once(task)
        except ImproperlyDeclared as exc:
            raise compat.InvalidTask(str(exc)) from None

    def _build_once(self, task: Any) -> None:
        """Check the decorator's retry and timeout keywords, once per distinct task: a task is
        frozen, and this backend's OPTIONS do not change while it exists."""
        key = repr(task)
        if key not in self._built:
            build(task)
            self._built.add(key)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Store a pending run of ``task``; return its TaskResult (READY)."""
        self.validate_task(task)
        args, kwargs = compat.normalize_json(args), compat.normalize_json(kwargs)
        name = job_for(task).name
        args, kwargs = validation.check_task_inputs(
            name, args=args, kwargs=kwargs, priority=task.priority, queue=task.queue_name,
            queues=self.queues, at=task.run_after,
        )  # fmt: skip
        run = services.enqueue(
            name, at=task.run_after, priority=task.priority, by="django.tasks",
            columns={"task_path": name, "args": args, "kwargs": kwargs},
        )  # fmt: skip
        result = self._result(run, task, events=[])
        compat.task_enqueued.send(sender=type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """Return the TaskResult of run ``result_id``; TaskResultDoesNotExist when there is none
        (or it is not a task's run)."""
        run = self._run(result_id)
        return self._result(run, self._task_of(run))

    def _run(self, result_id: Any) -> JobRun:
        try:
            pk = int(result_id)
        except (TypeError, ValueError):
            raise compat.TaskResultDoesNotExist(result_id) from None
        runs = JobRun.objects.using(app_settings.DATABASE).filter(pk=pk).exclude(task_path="")
        run = runs.first()
        if run is None:
            raise compat.TaskResultDoesNotExist(result_id)
        return run

    def _task_of(self, run: JobRun) -> Any:
        from django.utils.module_loading import import_string

        from .jobs import is_ours

        try:
            task = import_string(run.task_path)
        except ImportError as exc:
            raise compat.TaskResultDoesNotExist(f"{run.pk}: {exc}") from None
        if not is_ours(task):
            raise compat.TaskResultDoesNotExist(f"{run.pk}: {run.task_path} is not a task here")
        return task

    def _result(self, run: JobRun, task: Any, events: list | None = None) -> Any:
        from .results import result_of

        return result_of(run, task, events)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Report each problem of this backend's OPTIONS (``cluster_jobs.E021``)."""
        return [
            checks.Error(
                f"TASKS[{self.alias!r}]: {option_of(problem.field)} {problem.value!r} is not "
                "usable.",
                hint=problem.hint,
                id="cluster_jobs.E021",
            )
            for problem in self.problems
        ]


__all__ = ["ClusterJobsBackend", "ClusterJobsError", "ClusterTask"]

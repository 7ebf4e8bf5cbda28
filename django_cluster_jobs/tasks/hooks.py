"""What connects the backend to a process: the registry's resolver and ``task_finished``.

``install()`` runs in ``AppConfig.ready()``; it does nothing where no django.tasks API is
installed (the system check says so when TASKS names this backend).
"""

from __future__ import annotations

import logging
from typing import Any

from .. import signals
from ..conf import app_settings
from ..models import JobRun
from ..registry import registry

logger = logging.getLogger(__name__)


def install() -> None:
    """Let nodes find tasks by their path and send ``task_finished`` for the runs of tasks."""
    try:
        from . import compat  # noqa: F401
    except ImportError:
        return
    from .jobs import resolve

    registry.add_resolver(resolve)
    for signal in (signals.run_succeeded, signals.run_failed, signals.run_lost):
        signal.connect(finished, dispatch_uid=f"cluster_jobs_tasks_{id(signal)}")


def finished(sender: Any, run_id: int, will_retry: bool = False, **kwargs: Any) -> None:
    """Send ``task_finished`` once a task's run has ended (not for an attempt that is retried)."""
    from .jobs import TaskJob

    if will_retry:
        return
    try:
        job = registry.get(sender)  # the leader sends run_lost for tasks it may not have imported
    except Exception:
        return
    if not isinstance(job, TaskJob):
        return
    from . import compat, running
    from .results import result_of

    run = running.ended(run_id, kwargs)
    if run is None:
        run = JobRun.objects.using(app_settings.DATABASE).get(pk=run_id)
    result = result_of(run, job.task)
    compat.task_finished.send(sender=type(job.task.get_backend()), task_result=result)

"""A run of the ledger read as a django.tasks TaskResult: status, errors, attempts, workers."""

from __future__ import annotations

from typing import Any

from ..models import EventKind, JobRun, Outcome, RunEvent, RunState
from . import compat

#: The run's state → the status Django documents. A retry waiting to run is pending: READY.
STATUS: dict[str, str] = {
    RunState.PENDING: "READY",
    RunState.RUNNING: "RUNNING",
    RunState.SUCCEEDED: "SUCCESSFUL",
}
#: Timeline entries that start an attempt (each names the node that ran it).
ATTEMPTS = (EventKind.STARTED, EventKind.TAKEN_OVER)
#: Timeline entries that end an attempt with an error.
FAILURES = (EventKind.FAILED, EventKind.TIMED_OUT, EventKind.DEAD_LETTERED, EventKind.LOST,
            EventKind.CANCELLED)  # fmt: skip


class TaskLost(Exception):
    """The error of a task whose node died under at-most-once delivery: it is never re-run."""


class TaskCancelled(Exception):
    """The error of a task an operator cancelled."""


#: The exception path of a failure whose timeline entry carries no traceback.
SYNTHETIC: dict[str, str] = {
    EventKind.LOST: f"{__name__}.TaskLost",
    EventKind.CANCELLED: f"{__name__}.TaskCancelled",
    EventKind.TIMED_OUT: "builtins.TimeoutError",
}


def status_of(state: str) -> Any:
    """FAILED for every end but success: failed, timed out, dead-lettered, lost, cancelled."""
    return compat.TaskResultStatus(STATUS.get(state, "FAILED"))


#: Outcomes of runs made pending by a call: their first take is their first attempt's start.
CALLED = (Outcome.ENQUEUED, Outcome.MANUAL, Outcome.REPLAY)
#: The fence of a called run after its first take (it is stored pending with fence 1, and every
#: take adds one).
TAKEN_ONCE = 2


def timeline_of(run: JobRun) -> list[RunEvent]:
    """The run's timeline entries, oldest first. A called run taken once and never retried,
    running or succeeded, has one that counts, its start, which its row says: no query."""
    at = run.started_at
    once = run.fence == TAKEN_ONCE and run.attempt == 1 and run.outcome in CALLED
    if at is not None and once and run.state in (RunState.RUNNING, RunState.SUCCEEDED):
        kind = EventKind.STARTED
        return [RunEvent(run_id=run.pk, kind=kind, node=run.node, fence=TAKEN_ONCE, at=at)]
    events = RunEvent.objects.using(run._state.db).filter(run_id=run.pk)
    return list(events.order_by("at", "id"))


def result_of(run: JobRun, task: Any, events: list[RunEvent] | None = None) -> Any:
    """Return the TaskResult of ``run``; ``events`` are its timeline (read when None)."""
    if events is None:
        events = timeline_of(run)
    starts = [event for event in events if event.kind in ATTEMPTS]
    result: Any = compat.TaskResult(
        task=task.using(priority=run.priority) if task.priority != run.priority else task,
        id=str(run.pk),
        status=status_of(run.state),
        enqueued_at=run.created_at,
        started_at=starts[0].at if starts else None,
        finished_at=run.finished_at,
        last_attempted_at=starts[-1].at if starts else None,
        args=run.args or [],
        kwargs=run.kwargs or {},
        backend=task.backend,
        errors=[error_of(event) for event in events if event.kind in FAILURES],
        worker_ids=[event.node for event in starts],
    )
    if run.state == RunState.SUCCEEDED:
        object.__setattr__(result, "_return_value", run.result)
    return result


def error_of(event: RunEvent) -> Any:
    """The TaskError of a failed attempt: its exception's class path and its traceback."""
    error, _, traceback = event.reason.partition("\n\n")
    return compat.TaskError(
        exception_class_path=exception_path(event.kind, error, traceback),
        traceback=traceback or error,
    )


def exception_path(kind: str, error: str, traceback: str) -> str:
    """The dotted path of the exception a failure recorded.

    A traceback's last line names the exception as Python prints it, module-qualified except
    for builtins; the error line (``Name: message``) is the fallback.
    """
    lines = [line for line in traceback.splitlines() if line and not line[0].isspace()]
    shown = (lines[-1] if lines else error).partition(":")[0].strip()
    if not shown or " " in shown:
        return SYNTHETIC.get(kind, "builtins.Exception")
    return shown if "." in shown else f"builtins.{shown}"

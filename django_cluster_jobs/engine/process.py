"""The process executor: run a handler in a spawned child that can be killed at its deadline."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from .._child import main as child_main
from ..context import RunContext
from ..models import RunState
from .runlog import buffer_of, received

#: Seconds between two looks at the child, the deadline and the cancel flag.
POLL = 0.05
#: What _receive returns once the child's end of the pipe is closed.
CLOSED = object()


def run_in_process(
    job: str, callable_name: str, ctx: RunContext, payload: dict, timeout: float | None
) -> tuple[str, Any, str, str, str]:
    """Run the handler in a child process; kill it at the deadline or when ctx is cancelled.

    Returns (state, result, error, traceback, exception type name).
    """
    mp = multiprocessing.get_context("spawn")
    receive, send = mp.Pipe(duplex=False)
    fields = {
        "run_id": ctx.run_id,
        "job": ctx.job,
        "key": ctx.key,
        "scheduled_at": ctx.scheduled_at,
        "attempt": ctx.attempt,
        "fence": ctx.fence,
        "node_id": ctx.node_id,
        "callable_name": callable_name,
    }
    child = mp.Process(target=child_main, args=(job, fields, payload, send), daemon=True)
    child.start()
    send.close()
    deadline = time.monotonic() + timeout if timeout else None
    try:
        return _watch(child, receive, ctx, deadline, timeout)
    finally:
        if child.is_alive():
            child.kill()
        child.join(5)
        receive.close()


def _watch(
    child: Any, receive: Any, ctx: RunContext, deadline: float | None, timeout: float | None
) -> tuple[str, Any, str, str, str]:
    buffer = buffer_of(ctx.logger)
    while True:
        message = _receive(receive)
        if isinstance(message, tuple) and message[0] == "log":  # a line (runlog.PipeSink)
            if buffer is not None:
                received(buffer, *message[1:])
        elif isinstance(message, tuple):
            status, result, error, tb, exc_type = message
            state = RunState.SUCCEEDED if status == "ok" else RunState.FAILED
            return state, result, error, tb, exc_type
        if deadline is not None and time.monotonic() >= deadline:
            return (
                RunState.TIMED_OUT,
                None,
                f"TimeoutError: killed after {timeout}s",
                "",
                "TimeoutError",
            )
        if ctx.cancelled:
            return RunState.CANCELLED, None, "cancelled: the child process was killed", "", ""
        if not child.is_alive() and (message is CLOSED or not receive.poll(0)):
            return (
                RunState.FAILED,
                None,
                f"the child process died (exit code {child.exitcode})",
                "",
                "ChildProcessError",
            )


def _receive(receive: Any) -> Any:
    """The child's next message, waiting up to POLL: None when none came, CLOSED when the child
    closed the pipe without an outcome (it ended; nothing more can come)."""
    try:
        return receive.recv() if receive.poll(POLL) else None
    except EOFError:
        time.sleep(POLL)  # give the ended child a moment to be seen as such
        return CLOSED

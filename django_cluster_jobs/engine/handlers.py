"""Calling a handler and making what it returns storable: async handlers, odd results, odd text."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from asgiref.sync import async_to_sync
from django.core.serializers.json import DjangoJSONEncoder

from ..context import RunContext
from ..registry import Job

#: Largest result stored as is (JSON text); a larger one is stored as a note of its size.
RESULT_LIMIT = 1024 * 1024
#: Largest error or traceback text stored (the end is kept: it holds the exception).
TEXT_LIMIT = 64 * 1024
#: Seconds between two looks at the cancel flag while an async handler runs.
CANCEL_POLL = 0.05


def call(job: Job, ctx: RunContext, payload: dict) -> Any:
    """Call the handler; await it if it is async, as Django runs async code from sync code.

    ``async_to_sync`` runs it in an event loop while this worker thread serves the handler's
    ``sync_to_async`` calls, so its database work uses this thread's connections (closed with the
    thread's). Setting ``ctx.cancelled`` (cancel, timeout, shutdown, lost run) cancels its task,
    which raises ``CancelledError`` at its next ``await``.
    """
    result = job.invoke(ctx, payload)
    if inspect.isawaitable(result):
        return async_to_sync(_until_cancelled)(result, ctx)
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        raise TypeError(f"job {job.name!r}: a handler must return, not yield")
    return result


async def _until_cancelled(awaitable: Any, ctx: RunContext) -> Any:
    task = asyncio.ensure_future(awaitable)
    while not task.done():
        await asyncio.wait({task}, timeout=CANCEL_POLL)
        if ctx.cancelled and not task.done():
            task.cancel()
    return task.result()


def merged_payload(defaults: object, payload: object) -> dict[str, Any]:
    """The handler's keyword arguments: the job's payload, overridden by the run's.

    Raises TypeError naming the culprit when either is not a JSON object with str keys (a row
    written before it was validated): the run then fails with that reason, once.
    """
    merged: dict[str, Any] = {}
    for what, value in (("the job's payload", defaults), ("the run's payload", payload)):
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            shown = _repr(value)[:200]
            raise TypeError(f"{what} is {shown}, not a JSON object of keyword arguments")
        merged.update(value)
    return merged


def storable(value: Any) -> Any:
    """Return ``value`` as the JSON that will be stored, encoded as Django encodes it (dates,
    times, decimals and UUIDs as strings); anything else as its repr. Never raises."""
    try:
        text = json.dumps(value, cls=DjangoJSONEncoder, allow_nan=False)
    except (TypeError, ValueError, RecursionError, OverflowError):
        text = json.dumps(safe_text(_repr(value), RESULT_LIMIT))
    if len(text) > RESULT_LIMIT:
        text = json.dumps(f"a result of {len(text)} bytes of JSON, over the {RESULT_LIMIT} stored")
    # PostgreSQL's text and jsonb cannot hold NUL; store U+FFFD where the handler had one.
    return json.loads(text.replace("\\u0000", "\\ufffd"))


def safe_text(text: object, limit: int = TEXT_LIMIT) -> str:
    """Return ``text`` as a str any database column holds: no NUL, at most ``limit`` characters
    (the end kept: an error's last lines say what happened)."""
    text = str(text).replace("\x00", "\ufffd")
    if len(text) <= limit:
        return text
    return f"[…{len(text) - limit} characters cut]\n" + text[-limit:]


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a __repr__ that raises still leaves a trace
        return f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"

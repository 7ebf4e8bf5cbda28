"""Per-run logs: what a handler logs through ``ctx.logger``, kept for its run.

``ctx.logger`` is a :class:`RunLogger`: every record still goes to the project's logging as
before, and each one at or above ``RUN_LOG_LEVEL`` is also kept, rendered, in the attempt's
:class:`RunLogBuffer` in memory, bounded by ``RUN_LOG_MAX_LINES`` and ``RUN_LOG_MAX_BYTES``. The
runner stores the buffer with the run when the attempt ends, in one insert under the run's fence
(``ledger.runs.Runs.store_log``): a log call never waits on the database.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from ..conf import app_settings
from .handlers import safe_text


class Line(NamedTuple):
    """One line kept: when it was logged (cluster time), its level and its text."""

    at: datetime
    level: int
    message: str


def capture_level() -> int | None:
    """The lowest level kept (``RUN_LOG_LEVEL`` as a number); None keeps nothing."""
    level = app_settings.RUN_LOG_LEVEL
    if level is None or isinstance(level, int):
        return level
    return logging.getLevelNamesMapping()[str(level).upper()]


class RunLogBuffer:
    """The lines of one attempt, bounded in lines and bytes (of UTF-8); safe across threads.

    Past a bound, lines are counted and dropped; :meth:`close` ends the buffer (what is logged
    after it is not kept) and returns the lines, with a marker line saying what was dropped.
    """

    def __init__(self, now: Callable[[], datetime]) -> None:
        self.now = now
        self.level = capture_level()
        self.max_lines = app_settings.RUN_LOG_MAX_LINES
        self.max_bytes = app_settings.RUN_LOG_MAX_BYTES
        self.lines: list[Line] = []
        self.size = self.dropped_lines = self.dropped_bytes = 0
        self.closed = False
        self._lock = threading.Lock()

    def wants(self, level: int) -> bool:
        return self.level is not None and level >= self.level and not self.closed

    def add(self, level: int, message: str, at: datetime | None = None) -> None:
        """Keep one line, unless it passes a bound (then count it as dropped)."""
        text = safe_text(message, self.max_bytes)
        size = len(text.encode("utf-8", "replace"))
        with self._lock:
            if self.closed:
                return
            if len(self.lines) >= self.max_lines or self.size + size > self.max_bytes:
                self.dropped_lines += 1
                self.dropped_bytes += size
                return
            self.lines.append(Line(at or self.now(), level, text))
            self.size += size

    def close(self) -> list[Line]:
        """End the buffer; return its lines, and a last one marking what was dropped."""
        with self._lock:
            self.closed = True
            lines = list(self.lines)
            if self.dropped_lines:
                lines.append(Line(self.now(), logging.WARNING, self._marker()))
        return lines

    def _marker(self) -> str:
        return (
            f"[{self.dropped_lines} more log lines ({self.dropped_bytes} bytes) not stored: this "
            f"attempt reached its bound of {self.max_lines} lines or {self.max_bytes} bytes "
            f"(RUN_LOG_MAX_LINES, RUN_LOG_MAX_BYTES)]"
        )


class PipeSink:
    """A process-executor child's buffer: each line kept goes to the parent on ``out``, which
    bounds and stores it, so what the child logged before it was killed is kept too."""

    def __init__(self, out: Any) -> None:
        self.out, self.level = out, capture_level()
        self._lock = threading.Lock()

    def wants(self, level: int) -> bool:
        return self.level is not None and level >= self.level

    def add(self, level: int, message: str) -> None:
        with self._lock:  # a handler's threads may log at once; a pipe sends one at a time
            self.out.send(("log", level, message, time.time()))


def received(buffer: RunLogBuffer, level: int, message: str, sent: float) -> None:
    """Keep a line a child sent at ``sent`` (its wall clock), stamped in cluster time."""
    age = max(0.0, time.time() - sent)
    buffer.add(level, message, buffer.now() - timedelta(seconds=age))


class RunLogger(logging.LoggerAdapter):
    """``ctx.logger``: logs as a LoggerAdapter does, and keeps each record in ``buffer``."""

    def __init__(self, logger: logging.Logger, extra: dict[str, Any], buffer: Any) -> None:
        super().__init__(logger, extra)
        #: Where kept lines go: a RunLogBuffer, or a child process's pipe (see _child).
        self.buffer = buffer

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if self.buffer.wants(level):
            self.buffer.add(level, render(msg, args, kwargs.get("exc_info")))
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # name the handler's line
        super().log(level, msg, *args, **kwargs)


def render(msg: object, args: tuple[Any, ...], exc_info: Any) -> str:
    """The message as logging formats it (``msg % args``), then the traceback if one is given.

    Never raises: a message its arguments do not fit is kept as the message and the arguments.
    """
    try:
        text = str(msg) % args if args else str(msg)
    except Exception:
        text = f"{msg!s} {args!r}"
    if exc_info:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif not isinstance(exc_info, tuple):
            exc_info = sys.exc_info()
        if exc_info[0] is not None:
            text += "\n" + "".join(traceback.format_exception(*exc_info)).rstrip()
    return text


def buffer_of(logger: logging.LoggerAdapter) -> RunLogBuffer | None:
    """The buffer a run's ``ctx.logger`` keeps its lines in; None for any other logger."""
    if isinstance(logger, RunLogger) and isinstance(logger.buffer, RunLogBuffer):
        return logger.buffer
    return None

"""Execute one won run on an executor thread and write its outcome back, fenced."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError

from ..conf import app_settings
from ..context import RunContext
from ..coordination import Coordinator, Won
from ..models import RunState
from .clock import Clock
from .executor import release_broken_connections
from .planner import Planned

logger = logging.getLogger("django_cluster_jobs.run")

#: Seconds between two tries of a write-back that hit a database error.
WRITE_BACK_RETRY = 0.5


def jsonable(value: Any) -> Any:
    """Return ``value`` if it can be stored as JSON, else its repr."""
    try:
        DjangoJSONEncoder().encode(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


@dataclass
class Active:
    """A run executing on this node."""

    won: Won
    planned: Planned
    context: RunContext
    since: float  # time.monotonic() when it started


class Runner:
    """Runs a handler with its context, then records succeeded or failed under its fence."""

    def __init__(self, coordinator: Coordinator, clock: Clock, node_id: str) -> None:
        self.coordinator, self.clock, self.node_id = coordinator, clock, node_id
        self.running: dict[int, Active] = {}
        self._lock = threading.Lock()

    def context(
        self, won: Won, planned: Planned, scheduled_at: datetime, payload: dict
    ) -> RunContext:
        extra = self.extra(won, planned)
        logger_name = f"django_cluster_jobs.jobs.{planned.name}"
        return RunContext(
            run_id=won.run_id,
            job=planned.name,
            key=won.key,
            scheduled_at=scheduled_at,
            attempt=won.attempt,
            fence=won.fence,
            node_id=self.node_id,
            payload=payload,
            logger=logging.LoggerAdapter(logging.getLogger(logger_name), extra),
        )

    def extra(self, won: Won, planned: Planned) -> dict[str, Any]:
        return {
            "job": planned.name,
            "occurrence": won.key,
            "node": self.node_id,
            "fence": won.fence,
            "run_id": won.run_id,
        }

    def run(
        self,
        won: Won,
        planned: Planned,
        scheduled_at: datetime,
        payload: dict,
        on_done: Callable[[datetime], None] | None = None,
    ) -> None:
        """Run the handler and write back its outcome; call ``on_done`` with the finish time."""
        ctx = self.context(won, planned, scheduled_at, payload)
        with self._lock:
            self.running[won.run_id] = Active(won, planned, ctx, time.monotonic())
        logger.info(
            "running %s @ %s (attempt %s)",
            planned.name,
            won.key,
            won.attempt,
            extra=self.extra(won, planned),
        )
        try:
            state, result, error, tb = self._invoke(planned, ctx, payload)
            finished = self.write_back(won, planned, state, result, error, tb)
        finally:
            with self._lock:
                self.running.pop(won.run_id, None)
        if on_done is not None:
            on_done(finished)

    @staticmethod
    def _invoke(planned: Planned, ctx: RunContext, payload: dict) -> tuple[str, Any, str, str]:
        try:
            result = planned.job.invoke(ctx, payload)
        except Exception as exc:
            return RunState.FAILED, None, f"{type(exc).__name__}: {exc}", traceback.format_exc()
        return RunState.SUCCEEDED, jsonable(result), "", ""

    def write_back(
        self, won: Won, planned: Planned, state: str, result: Any, error: str, tb: str
    ) -> datetime:
        """Record the outcome under the run's fence, retrying database errors while the lease
        could still be ours; a stale fence is logged and recorded as fenced out."""
        deadline = time.monotonic() + app_settings.LEASE_TTL
        extra = self.extra(won, planned)
        while True:
            finished = self.clock.now()
            try:
                recorded = self.coordinator.finish(
                    won, self.node_id, state, finished, result=result, error=error, traceback=tb
                )
                break
            except DatabaseError as exc:
                release_broken_connections()
                if time.monotonic() >= deadline:
                    logger.error(
                        "could not record %s of %s @ %s: %s; its lease will expire",
                        state,
                        planned.name,
                        won.key,
                        exc,
                        extra=extra,
                    )
                    return finished
                time.sleep(WRITE_BACK_RETRY)
        if recorded:
            logger.info("%s %s @ %s", state, planned.name, won.key, extra=extra)
        else:
            logger.warning(
                "fenced out: %s @ %s ended %s but fence %s is stale; the newer "
                "owner's result stands",
                planned.name,
                won.key,
                state,
                won.fence,
                extra=extra,
            )
        return finished

    def cancel(self, run_ids: set[int] | None = None) -> None:
        """Flag the given running handlers (all when None) as cancelled."""
        with self._lock:
            for run_id, active in self.running.items():
                if run_ids is None or run_id in run_ids:
                    active.context.cancel_event.set()

    def snapshot(self) -> list[Active]:
        with self._lock:
            return list(self.running.values())

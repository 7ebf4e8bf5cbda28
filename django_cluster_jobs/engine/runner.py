"""Execute one won run on an executor thread and write its outcome back, fenced."""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from ..context import RunContext
from ..coordination import Coordinator, Won
from ..models import RunState
from .clock import Clock
from .planner import Planned

logger = logging.getLogger("django_cluster_jobs.run")


def jsonable(value: Any) -> Any:
    """Return ``value`` if it can be stored as JSON, else its repr."""
    try:
        DjangoJSONEncoder().encode(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


class Runner:
    """Runs a handler with its context, then records succeeded or failed under its fence."""

    def __init__(self, coordinator: Coordinator, clock: Clock, node_id: str) -> None:
        self.coordinator, self.clock, self.node_id = coordinator, clock, node_id
        self.running: dict[int, RunContext] = {}
        self._lock = threading.Lock()

    def context(
        self, won: Won, planned: Planned, scheduled_at: datetime, payload: dict
    ) -> RunContext:
        extra = {
            "job": planned.name,
            "occurrence": won.key,
            "node": self.node_id,
            "fence": won.fence,
            "run_id": won.run_id,
        }
        return RunContext(
            run_id=won.run_id,
            job=planned.name,
            key=won.key,
            scheduled_at=scheduled_at,
            attempt=won.attempt,
            fence=won.fence,
            node_id=self.node_id,
            payload=payload,
            logger=logging.LoggerAdapter(
                logging.getLogger(f"django_cluster_jobs.jobs.{planned.name}"), extra
            ),
        )

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
            self.running[won.run_id] = ctx
        extra = {
            "job": planned.name,
            "occurrence": won.key,
            "node": self.node_id,
            "fence": won.fence,
        }
        logger.info("running %s @ %s", planned.name, won.key, extra=extra)
        try:
            state, result, error, tb = self._invoke(planned, ctx, payload)
            finished = self.clock.now()
            if not self.coordinator.finish(
                won, self.node_id, state, finished, result=result, error=error, traceback=tb
            ):
                logger.warning(
                    "fenced out: %s @ %s finished as %s but fence %s is stale; the "
                    "newer owner's result stands",
                    planned.name,
                    won.key,
                    state,
                    won.fence,
                    extra=extra,
                )
            else:
                logger.info("%s %s @ %s", state, planned.name, won.key, extra=extra)
        except Exception:
            logger.exception(
                "could not record the end of %s @ %s", planned.name, won.key, extra=extra
            )
            finished = self.clock.now()
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

    def cancel_all(self) -> None:
        """Flag every running handler's context as cancelled."""
        with self._lock:
            for ctx in self.running.values():
                ctx.cancel_event.set()

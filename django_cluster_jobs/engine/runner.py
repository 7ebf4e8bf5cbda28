"""Execute one won run and conclude it under its fence: succeed, retry, dead-letter or fail."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Any

from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    ProgrammingError,
    connections,
    transaction,
)

from .. import signals
from ..choices import Executor
from ..conf import app_settings
from ..context import RunContext
from ..coordination import Won
from ..ledger import Ledger
from ..ledger.breaker import open_if_tripped
from ..models import Delivery, EventKind, Overlap, RunState
from ..observe import tracing
from ..policies.retry import Backoff, final_state, retryable
from .clock import Clock
from .executor import release_broken_connections
from .handlers import call, safe_text, storable
from .planner import Planned
from .runlog import RunLogBuffer, RunLogger, buffer_of

logger = logging.getLogger("django_cluster_jobs.run")

#: Seconds between two tries of a write-back that hit a database error.
WRITE_BACK_RETRY = 0.5
#: Longest wait for an occurrence claimed early (by a correction of the node's clock offset).
EARLY_LIMIT = 5.0


#: Write-back errors that trying again cannot cure (the row, not the connection, is the
#: problem): the outcome is then stored without its result.
PERMANENT = (DataError, IntegrityError, ProgrammingError, TypeError, ValueError)


@dataclass
class Ending:
    """How a handler ended, before policies decide what that means for the run."""

    state: str
    result: Any = None
    error: str = ""
    traceback: str = ""
    exception: BaseException | str | None = None


class Stop(StrEnum):
    """Why a running handler was told to stop."""

    NONE = ""
    TIMEOUT = "timeout"  # its timeout passed
    CANCEL = "cancel"  # an operator asked (cancel_requested)
    LOST = "lost"  # the database no longer confirms this node's fence
    SHUTDOWN = "shutdown"  # the node stops


@dataclass
class Active:
    """A run executing on this node."""

    won: Won
    planned: Planned
    context: RunContext
    why: Stop = Stop.NONE
    #: The trace id of the run's span, stamped on its log lines ("" when not traced).
    trace_id: str = ""
    concluded: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop(self, why: Stop) -> None:
        self.why = self.why or why
        self.context.cancel_event.set()

    def conclude_once(self) -> bool:
        """True for the one caller that gets to write the run's outcome."""
        with self.lock:
            first, self.concluded = not self.concluded, True
        return first


class _RolledBack(Exception):
    """Leave an exactly-once run's transaction, rolling back what its handler wrote."""

    def __init__(self, outcome: Ending | None, why: str = "", *, fenced: bool = False) -> None:
        super().__init__(why)
        self.outcome, self.why, self.fenced = outcome, why, fenced


class Runner:
    """Runs handlers with their context and writes outcomes back by the job's policies."""

    def __init__(self, ledger: Ledger, clock: Clock, node_id: str) -> None:
        self.ledger, self.clock, self.node_id = ledger, clock, node_id
        self.running: dict[int, Active] = {}
        self._lock = threading.Lock()

    def context(
        self, won: Won, planned: Planned, scheduled_at: datetime, payload: dict
    ) -> RunContext:
        return RunContext(
            run_id=won.run_id,
            job=planned.name,
            key=won.key,
            scheduled_at=scheduled_at,
            attempt=won.attempt,
            fence=won.fence,
            node_id=self.node_id,
            payload=payload,
            logger=RunLogger(
                logging.getLogger(f"django_cluster_jobs.jobs.{planned.name}"),
                self.extra(won, planned),
                RunLogBuffer(self.clock.now),
            ),
        )

    def extra(self, won: Won, planned: Planned) -> dict[str, Any]:
        return {
            "job": planned.name,
            "occurrence": won.key,
            "node": self.node_id,
            "fence": won.fence,
            "run_id": won.run_id,
        }

    def _signal(self, signal: Any, active: Active, **kwargs: Any) -> None:
        won = active.won
        signals.send(
            signal,
            active.planned.name,
            run_id=won.run_id,
            key=won.key,
            node=self.node_id,
            attempt=won.attempt,
            **kwargs,
        )

    def run(
        self,
        won: Won,
        planned: Planned,
        scheduled_at: datetime,
        payload: dict,
        on_done: Callable[[datetime], None] | None = None,
    ) -> None:
        """Run the handler, then conclude; call ``on_done`` with the finish time."""
        active = Active(won, planned, self.context(won, planned, scheduled_at, payload))
        with self._lock:
            self.running[won.run_id] = active
        logger.info(
            "running %s @ %s (attempt %s)",
            planned.name,
            won.key,
            won.attempt,
            extra=self.extra(won, planned),
        )
        self._not_before(scheduled_at)
        self._signal(signals.run_started, active, scheduled_at=scheduled_at)
        timers = self._arm_timeout(active)
        finished = self.clock.now()
        try:
            with tracing.run_span(
                self.ledger.alias, won, planned, scheduled_at, self.node_id
            ) as span:
                active.trace_id = tracing.trace_id(span)
                if planned.definition.delivery == Delivery.EXACTLY_ONCE:
                    outcome, finished = self._exactly_once(active, payload)
                else:
                    outcome = self._execute(active, payload)
                    finished = self._conclude_contained(active, outcome)
                tracing.record_outcome(span, outcome.state, outcome.error)
        finally:
            for timer in timers:
                timer.cancel()
            with self._lock:
                self.running.pop(won.run_id, None)
        if on_done is not None:
            on_done(finished)

    def _conclude_contained(self, active: Active, outcome: Ending) -> datetime:
        """Conclude; a failure past the write-back (a signal receiver, the breaker) is logged,
        never raised, so the node goes on and a fixed-delay job is planned again."""
        try:
            return self.conclude(active, outcome)
        except Exception:
            logger.exception(
                "concluding %s @ %s failed after its outcome %s",
                active.planned.name,
                active.won.key,
                outcome.state,
                extra=self.extra(active.won, active.planned),
            )
            return self.clock.now()

    def _not_before(self, scheduled_at: datetime) -> None:
        """Never start a handler before its occurrence by cluster time (a claim made just before
        the node's offset was corrected can be a few milliseconds early)."""
        early = (scheduled_at - self.clock.now()).total_seconds()
        if 0 < early <= EARLY_LIMIT:
            time.sleep(early)

    def _arm_timeout(self, active: Active) -> list[threading.Timer]:
        """Thread executor: flag the handler cancelled at its deadline; if it has not returned
        a grace period later, conclude the run as timed out without it."""
        timeout = active.planned.definition.timeout
        if timeout is None or active.planned.definition.executor == Executor.PROCESS:
            return []
        seconds = timeout.total_seconds()
        forced = Ending(
            RunState.TIMED_OUT,
            error=f"TimeoutError: still running {seconds:g}s "
            f"after its deadline plus the grace period",
            exception="TimeoutError",
        )
        timers = [
            threading.Timer(seconds, active.stop, args=(Stop.TIMEOUT,)),
            threading.Timer(
                seconds + app_settings.GRACE_PERIOD, self._force, args=(active, forced)
            ),
        ]
        for timer in timers:
            timer.daemon = True
            timer.start()
        return timers

    def _force(self, active: Active, outcome: Ending) -> None:
        """Conclude a run whose handler outlived its deadline (runs on a timer thread)."""
        try:
            self.conclude(active, outcome)
        finally:
            connections.close_all()

    def _execute(self, active: Active, payload: dict) -> Ending:
        definition = active.planned.definition
        if definition.executor == Executor.PROCESS:
            from .process import run_in_process

            timeout = definition.timeout.total_seconds() if definition.timeout else None
            return Ending(
                *run_in_process(
                    active.planned.name, definition.callable_name, active.context, payload, timeout
                )
            )
        try:
            result = call(active.planned.job, active.context, payload)
        except BaseException as exc:  # SystemExit or a cancelled task too: this thread goes on
            outcome = Ending(
                RunState.FAILED,
                None,
                safe_text(f"{type(exc).__name__}: {exc}"),
                safe_text(traceback.format_exc()),
                exc,
            )
        else:
            outcome = Ending(RunState.SUCCEEDED, storable(result))
        if active.why == Stop.TIMEOUT:
            outcome.state = RunState.TIMED_OUT
            outcome.error = outcome.error or f"TimeoutError: exceeded {definition.timeout}"
        elif active.why == Stop.CANCEL:
            outcome.state = RunState.CANCELLED
        return outcome

    # -- exactly once ------------------------------------------------------------------------

    def _exactly_once(self, active: Active, payload: dict) -> tuple[Ending, datetime]:
        """Run the handler in one transaction on the ledger's database that ends with the run's
        fenced success, so its writes there and its end commit together or not at all.

        A handler that fails, a fence that moved (the run was taken over), an end another
        thread recorded first (a forced timeout) roll the transaction back; the attempt is then
        concluded as any other, outside it. An end that cannot be written for the database's
        sake (a lost connection, a failed commit) leaves the run to its lease: the takeover
        runs it again, its effects never applied twice.
        """
        won, planned = active.won, active.planned
        vendor, alias = self.ledger.vendor, self.ledger.alias
        timeout = planned.definition.timeout
        seconds = timeout.total_seconds() + app_settings.GRACE_PERIOD if timeout else None
        outcome = Ending(RunState.FAILED, error="the transaction did not start")
        now = self.clock.now()
        committed: list[bool] = []
        try:
            with transaction.atomic(using=alias):
                if not vendor.begin_effects(won, seconds):
                    raise _RolledBack(None, "this node no longer holds the run's fence")
                # Runs first of the on_commit callbacks: proves the commit even if one of the
                # handler's own callbacks then raises.
                transaction.on_commit(lambda: committed.append(True), using=alias)
                outcome = self._execute(active, payload)
                if outcome.state != RunState.SUCCEEDED:
                    raise _RolledBack(outcome)
                if not active.conclude_once():
                    raise _RolledBack(None, "its end was recorded meanwhile (its timeout)")
                now = self.clock.now()
                if not self._finish(active, outcome, now):
                    raise _RolledBack(outcome, "its fence is stale", fenced=True)
        except _RolledBack as back:
            return self._rolled_back(active, back, outcome, now)
        except DatabaseError as exc:
            if not committed:
                return self._not_committed(active, outcome, exc), self.clock.now()
            logger.exception("%s @ %s: an on_commit callback of its handler failed after "
                             "the commit", planned.name, won.key,
                             extra=self.extra(won, planned))  # fmt: skip
        finally:
            self._end_effects()
        self._store_log(active, now)
        logger.info("%s %s @ %s", outcome.state, planned.name, won.key,
                    extra=self.extra(won, planned))  # fmt: skip
        try:
            self._after(active, outcome, outcome.state, now)
        except Exception:  # a signal receiver: the run has ended, the node goes on
            logger.exception("after %s @ %s succeeded", planned.name, won.key,
                             extra=self.extra(won, planned))  # fmt: skip
        return outcome, now

    def _rolled_back(
        self, active: Active, back: _RolledBack, outcome: Ending, now: datetime
    ) -> tuple[Ending, datetime]:
        won, planned = active.won, active.planned
        if back.why:
            logger.warning("%s @ %s (attempt %s): its writes were rolled back: %s",
                           planned.name, won.key, won.attempt, back.why,
                           extra=self.extra(won, planned))  # fmt: skip
        if back.fenced and back.outcome is not None:
            self._write(active, back.outcome, now)  # fenced out again: recorded, signalled
            return back.outcome, now
        if back.outcome is None:
            return outcome, self.clock.now()
        return back.outcome, self._conclude_contained(active, back.outcome)

    def _not_committed(self, active: Active, outcome: Ending, exc: DatabaseError) -> Ending:
        """The transaction failed at its end. A connection that still works means the handler
        left it unusable (it caught a database error without a savepoint): that is the
        attempt's failure. Otherwise the end is unknown here; the run's lease decides."""
        won, planned = active.won, active.planned
        release_broken_connections()
        usable = self._usable()
        why = safe_text(f"{type(exc).__name__}: {exc}")
        if usable and outcome.state == RunState.SUCCEEDED:
            hint = (
                "the run's transaction could not commit (a database error the handler caught "
                "leaves it unusable: wrap what may fail in transaction.atomic())"
            )
            failed = Ending(RunState.FAILED, error=f"{why}\n{hint}", exception=exc)
            with active.lock:
                active.concluded = False  # its end was rolled back: record this one
            self._conclude_contained(active, failed)
            return failed
        logger.error("%s @ %s (attempt %s): its end could not be committed with its writes "
                     "(%s); both rolled back or both committed, its lease decides: it runs "
                     "again if it did not commit", planned.name, won.key, won.attempt, why,
                     extra=self.extra(won, planned))  # fmt: skip
        return outcome

    def _usable(self) -> bool:
        try:
            return bool(connections[self.ledger.alias].is_usable())
        except Exception:
            return False

    def _end_effects(self) -> None:
        try:
            self.ledger.vendor.end_effects()
        except DatabaseError:
            release_broken_connections()

    # -- concluding ---------------------------------------------------------------------------

    def conclude(self, active: Active, outcome: Ending) -> datetime:
        """Apply the job's policies to ``outcome`` and write the result back, fenced."""
        now = self.clock.now()
        if not active.conclude_once():
            return now
        self._store_log(active, now)
        failed = outcome.state in (RunState.FAILED, RunState.TIMED_OUT)
        definition = active.planned.definition
        never = active.planned.job.dont_retry
        attempt = active.won.attempt
        if failed and retryable(attempt, definition.max_attempts, outcome.exception, never):
            return self._retry(active, outcome, now)
        attempt_state = outcome.state
        if failed:
            outcome.state = final_state(outcome.state, definition.max_attempts)
        recorded = self._write(active, outcome, now)
        if recorded:
            self._after(active, outcome, attempt_state, now)
        return now

    def _store_log(self, active: Active, now: datetime) -> None:
        """Store what the attempt logged, before its end is written; an error doing so is
        logged and recorded on the run's timeline, never raised: the run ends as it would."""
        buffer = buffer_of(active.context.logger)
        lines = buffer.close() if buffer is not None else []
        if not lines:
            return
        won, extra = active.won, self.extra(active.won, active.planned)
        try:
            self.ledger.runs.store_log(won, self.node_id, lines, active.trace_id)
        except Exception as exc:
            release_broken_connections()
            why = safe_text(f"{len(lines)} log lines of attempt {won.attempt} not stored: "
                            f"{type(exc).__name__}: {exc}", 1000)  # fmt: skip
            logger.warning("%s @ %s: %s", active.planned.name, won.key, why, extra=extra)
            self._record_contained(won, EventKind.LOG_LOST, why, now)

    def _record_contained(self, won: Won, kind: str, reason: str, now: datetime) -> None:
        """Append to the run's timeline if the database lets us; never raise."""
        try:
            self.ledger.runs.record(won.run_id, kind, self.node_id, won.fence, reason, now)
        except Exception as exc:
            release_broken_connections()
            logger.warning("could not record %s on run %s: %s", kind, won.run_id, exc)

    def _retry(self, active: Active, outcome: Ending, now: datetime) -> datetime:
        policy = Backoff.from_dict(active.planned.name, active.planned.definition.backoff)
        due = now + policy.delay(active.won.attempt)
        if self._retrying(
            lambda: self.ledger.runs.retry(
                active.won, self.node_id, now, due, outcome.state, outcome.error, outcome.traceback
            ),
            active,
        ):
            logger.warning(
                "%s @ %s attempt %s %s; retry at %s",
                active.planned.name,
                active.won.key,
                active.won.attempt,
                outcome.state,
                due.isoformat(),
                extra=self.extra(active.won, active.planned),
            )
            self._signal(
                signals.run_failed,
                active,
                state=outcome.state,
                error=outcome.error,
                will_retry=True,
            )
            self._signal(signals.run_retried, active, due_at=due)
        return now

    def _write(self, active: Active, outcome: Ending, now: datetime) -> bool:
        won, planned = active.won, active.planned
        recorded = self._retrying(lambda: self._finish(active, outcome, now), active)
        extra = self.extra(won, planned)
        if recorded and outcome.state == RunState.SUCCEEDED:
            logger.info("%s %s @ %s", outcome.state, planned.name, won.key, extra=extra)
        elif recorded:
            logger.error(
                "%s %s @ %s (run %s, attempt %s): %s%s",
                outcome.state, planned.name, won.key, won.run_id, won.attempt, outcome.error,
                f"\n{outcome.traceback}" if outcome.traceback else "", extra=extra,
            )  # fmt: skip
        elif recorded is False:
            self._signal(signals.run_fenced_out, active, state=outcome.state)
            logger.warning(
                "fenced out: %s @ %s ended %s but fence %s is stale; the newer "
                "owner's result stands",
                planned.name,
                won.key,
                outcome.state,
                won.fence,
                extra=extra,
            )
        return bool(recorded)

    def _finish(self, active: Active, outcome: Ending, now: datetime) -> bool:
        """Write the outcome under the run's fence; if the row refuses it (what the handler
        returned or raised cannot be stored here), write it once more without the result, so
        the run still ends once instead of being re-run when its lease expires."""
        write = partial(self.ledger.runs.finish, leads=active.planned.leads)
        won, node = active.won, self.node_id
        try:
            return write(won, node, outcome.state, now, result=outcome.result,
                         error=outcome.error, traceback=outcome.traceback)  # fmt: skip
        except PERMANENT as exc:
            release_broken_connections()
            note = safe_text(f"the outcome could not be stored as it was ({type(exc).__name__}: "
                             f"{exc}); stored without its result")  # fmt: skip
            error = f"{outcome.error}\n{note}".strip()
            return write(won, node, outcome.state, now, result=None, error=error,
                         traceback=outcome.traceback)  # fmt: skip

    def _after(self, active: Active, outcome: Ending, attempt_state: str, now: datetime) -> None:
        definition = active.planned.definition
        if outcome.state == RunState.SUCCEEDED:
            self._signal(signals.run_succeeded, active, result=outcome.result, finished_at=now)
        elif outcome.state in (RunState.FAILED, RunState.TIMED_OUT, RunState.DEAD):
            self._signal(
                signals.run_failed,
                active,
                state=attempt_state,
                error=outcome.error,
                will_retry=False,
            )
            if outcome.state == RunState.DEAD:
                self._signal(signals.run_dead_lettered, active, error=outcome.error)
            self._maybe_open_breaker(active, now)
        if definition.overlap == Overlap.BUFFER_ONE:
            self.ledger.runs.release_buffered(definition.pk, now)

    def _maybe_open_breaker(self, active: Active, now: datetime) -> None:
        definition = active.planned.definition
        if not definition.breaker_threshold:
            return
        until = open_if_tripped(
            self.ledger.alias, definition.pk, definition.breaker_threshold,
            definition.breaker_cooldown, now,
        )  # fmt: skip
        if until is not None:
            logger.error(
                "circuit breaker opened for %s after %s consecutive failures; paused until %s",
                definition.name,
                definition.breaker_threshold,
                until.isoformat(),
                extra=self.extra(active.won, active.planned),
            )

    def _retrying(self, write: Callable[[], bool], active: Active) -> bool | None:
        """Run a write-back, retrying database errors while the lease could still be ours;
        None when it never got through (the lease will expire and the leader takes over)."""
        deadline = time.monotonic() + app_settings.LEASE_TTL
        while True:
            try:
                return write()
            except PERMANENT as exc:
                logger.error(
                    "could not record the end of %s @ %s: %s; its lease will expire",
                    active.planned.name, active.won.key, exc,
                    extra=self.extra(active.won, active.planned),
                )  # fmt: skip
                return None
            except DatabaseError as exc:
                release_broken_connections()
                if time.monotonic() >= deadline:
                    logger.error(
                        "could not record the end of %s @ %s: %s; its lease will expire",
                        active.planned.name,
                        active.won.key,
                        exc,
                        extra=self.extra(active.won, active.planned),
                    )
                    return None
                time.sleep(WRITE_BACK_RETRY)

    def cancel(self, run_ids: set[int] | None = None, why: Stop = Stop.SHUTDOWN) -> None:
        """Flag the given running handlers (all when None) as cancelled, saying why."""
        with self._lock:
            for run_id, active in self.running.items():
                if run_ids is None or run_id in run_ids:
                    active.stop(why)

    def snapshot(self) -> list[Active]:
        with self._lock:
            return list(self.running.values())

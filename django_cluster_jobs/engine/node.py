"""The node: registers itself, plans due times, claims them in batches and runs what it won."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from importlib.metadata import PackageNotFoundError, version

from django.db import DatabaseError, OperationalError, transaction
from django.utils.module_loading import import_string

from ..conf import app_settings
from ..coordination import Claim, Coordinator, get_coordinator
from ..coordination.base import is_lock_timeout
from ..models import JobDefinition, NodeStatus, Outcome, Source, WorkerNode
from ..registry import Job, Registry, registry
from . import stats
from .clock import Clock
from .executor import Executor, release_broken_connections
from .firing import Firing
from .heartbeat import HeartbeatThread
from .leader import Leader
from .planner import Planned, Planner, load_planned
from .runner import Runner

logger = logging.getLogger(__name__)

#: The longest the loop sleeps without a reason to wake.
MAX_SLEEP = 60.0
#: Restarts of a background thread that died before the node gives up and stops.
MAX_RESTARTS = 3
#: Seconds a starting node waits out a busy SQLite database ("database is locked").
BUSY_WAIT = 60.0
#: Seconds the loop pauses after a tick failed unexpectedly, so a failure cannot spin it.
TICK_BACKOFF = 1.0


def package_version() -> str:
    try:
        return version("django-cluster-jobs")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def default_clock() -> Clock:
    """The clock named by CLUSTER_JOBS['CLOCK'] (tests inject skewed ones), else the real one."""
    return import_string(app_settings.CLOCK)() if app_settings.CLOCK else Clock()


class Node(Firing):
    """One ``runscheduler`` process; drive it with :meth:`run` (tests pass ``max_ticks``)."""

    def __init__(
        self,
        node_id: str | None = None,
        *,
        clock: Clock | None = None,
        coordinator: Coordinator | None = None,
        threads: int | None = None,
        tags: frozenset[str] | None = None,
        jobs: Registry = registry,
    ) -> None:
        self.node_id = node_id or app_settings.node_id()
        self.clock = clock or default_clock()
        self.coordinator = coordinator or get_coordinator()
        self.tags = frozenset(app_settings.NODE_TAGS if tags is None else tags)
        self.registry = jobs
        self.executor = Executor(threads or app_settings.EXECUTOR_THREADS)
        self.runner = Runner(self.coordinator, self.clock, self.node_id)
        self.counters = stats.Counters()
        self.planner = Planner()
        self.planned: dict[str, Planned] = {}
        self.cluster_jobs: dict[str, Planned] = {}
        self.ticks = 0
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._inbox: queue.SimpleQueue[tuple[datetime, str]] = queue.SimpleQueue()
        self._reload = threading.Event()
        self._pending_due: datetime | None = None
        self._pending_blocked = False
        #: This node's start in cluster time: it plans each job from the later of the job's mark
        #: and what it collected of it, or this instant.
        self._started_at: datetime | None = None
        #: Per job, the latest occurrence this node claimed or decided to leave.
        self._collected: dict[str, datetime] = {}
        #: Per no-overlap job, when this node started its live run of it; and the occurrences
        #: held back until that run ends (see Firing._held_back).
        self._live_since: dict[str, datetime] = {}
        self._deferred: dict[str, list[datetime]] = {}
        self._released: queue.SimpleQueue[tuple[datetime, str]] = queue.SimpleQueue()
        self._registered = time.monotonic()
        self.heartbeat = HeartbeatThread(self)
        self.heartbeat_restarts = 0
        #: Why the node stopped on its own (the command exits non-zero), "" otherwise.
        self.failure = ""
        self.leader = Leader(self)
        self.listener = self._make_listener()

    def _make_listener(self):
        if not getattr(self.coordinator, "listens", False):
            return None
        from .listener import PendingListener

        return PendingListener(self)

    @property
    def log_extra(self) -> dict[str, str]:
        return {"node": self.node_id}

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- lifecycle ------------------------------------------------------------------------------

    def run(self, *, max_ticks: int | None = None, duration: float | None = None) -> None:
        """Start, loop until stopped (or ``max_ticks`` / ``duration``), then drain and stop."""
        self.start()
        timer = threading.Timer(duration or 0, self.request_stop, kwargs={"reason": "duration"})
        timer.daemon = True
        if duration is not None:
            timer.start()
        try:
            while not self._stopping.is_set():
                self.tick()
                if max_ticks is not None and self.ticks >= max_ticks:
                    break
                self._sleep()
        finally:
            timer.cancel()
            self.stop()

    def start(self) -> None:
        """Register, copy the code registry to the database, beat once, start the threads."""
        self.register()
        # The clock first: the node's start and its first plan are instants in cluster time.
        self.heartbeat.measure()
        self._mark_started()
        sync_definitions(self.registry, self.coordinator.alias)
        self.heartbeat.prime()
        self.reload()
        self.heartbeat.beat()
        self.heartbeat.start()
        if self.listener is not None:
            self.listener.start()
        self.wake_pending()
        self.fire_startup_jobs()
        logger.info(
            "node %s started with %d job(s)", self.node_id, len(self.planned), extra=self.log_extra
        )

    def request_stop(self, reason: str = "signal") -> None:
        """Stop claiming at once; the loop then drains. Safe from signal handlers and threads."""
        if not self._stopping.is_set():
            logger.info("node %s stopping (%s)", self.node_id, reason, extra=self.log_extra)
        self._stopping.set()
        self._wake.set()

    def stop(self) -> None:
        """Drain: finish running handlers within the grace period, hand back the rest, stop."""
        self._stopping.set()
        self._set_status(NodeStatus.DRAINING)
        grace = app_settings.GRACE_PERIOD
        if not self.executor.wait_idle(grace):
            self.hand_back_running()
        self.heartbeat.stop()
        if self.listener is not None:
            self.listener.stop()
        try:
            self.leader.resign()
        except DatabaseError:
            logger.warning("could not resign leadership", exc_info=True, extra=self.log_extra)
        self.executor.shutdown()
        self._set_status(NodeStatus.STOPPED, stopped=True)
        release_broken_connections()
        logger.info("node %s stopped", self.node_id, extra=self.log_extra)

    def hand_back_running(self) -> None:
        """Cancel the handlers still running and release their runs for another node at once."""
        active = self.runner.snapshot()
        logger.warning(
            "grace period over with %d run(s) still going; handing them back",
            len(active),
            extra=self.log_extra,
        )
        self.runner.cancel()
        now = self.clock.now()
        for run in active:
            try:
                state = self.coordinator.hand_back(run.won, self.node_id, now)
            except DatabaseError as exc:
                logger.warning(
                    "could not hand back %s @ %s: %s; its lease will expire",
                    run.planned.name,
                    run.won.key,
                    exc,
                    extra=self.log_extra,
                )
                continue
            logger.warning(
                "handed back %s @ %s: now %s",
                run.planned.name,
                run.won.key,
                state or "owned by another node",
                extra=self.log_extra,
            )

    def register(self) -> None:
        """Record this node as active; wait out a database busy with other writers."""
        deadline = time.monotonic() + BUSY_WAIT
        while True:
            try:
                return self._register()
            except OperationalError as exc:
                if not is_lock_timeout(exc) or time.monotonic() > deadline:
                    raise
                logger.warning("database busy while %s registers; waiting", self.node_id,
                               extra=self.log_extra)  # fmt: skip
                release_broken_connections()
                time.sleep(0.5)

    def _register(self) -> None:
        self._registered = time.monotonic()
        now = self.clock.now()
        WorkerNode.objects.using(self.coordinator.alias).update_or_create(
            node_id=self.node_id,
            defaults={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "version": package_version(),
                "tags": sorted(self.tags),
                "status": NodeStatus.ACTIVE,
                "started_at": now,
                "last_heartbeat": now,
                "stopped_at": None,
            },
        )

    def _mark_started(self) -> None:
        """Plan from the moment this node registered, in cluster time, and store that moment.

        The leader's catch-up leaves every occurrence after a live node's ``started_at`` to the
        nodes, so the first plan must collect everything after it, including what falls due while
        the node loads its definitions; a clock found to be off corrects the stored start.
        """
        started = self.clock.now() - timedelta(seconds=time.monotonic() - self._registered)
        self._started_at = started
        if self.clock.offset:
            WorkerNode.objects.using(self.coordinator.alias).filter(node_id=self.node_id).update(
                started_at=started, last_heartbeat=started
            )

    def _set_status(self, status: str, *, stopped: bool = False) -> None:
        offset_ms = self.clock.offset.total_seconds() * 1000
        fields = {"status": status, **self.counters.snapshot(offset_ms).fields()}
        if stopped:
            fields["stopped_at"] = self.clock.now()
        try:
            WorkerNode.objects.using(self.coordinator.alias).filter(node_id=self.node_id).update(
                **fields
            )
        except DatabaseError:
            logger.warning(
                "could not mark node %s %s",
                self.node_id,
                status,
                exc_info=True,
                extra=self.log_extra,
            )

    # -- planning -------------------------------------------------------------------------------

    def reload(self) -> None:
        """Reload definitions from the database and re-plan every job's next due time."""
        loaded = load_planned(self.coordinator.alias, self.registry)
        #: Every registered definition, whatever its tags: the leader's chores cover them all.
        self.cluster_jobs = loaded
        self.planned = {n: p for n, p in loaded.items() if p.runs_here(self.tags)}
        self.planner.clear()
        now = self.clock.now()
        for planned in self.planned.values():
            due = self._first_due(planned, now)
            if due is not None:
                self.planner.push(due, planned.name)

    def _first_due(self, planned: Planned, now: datetime) -> datetime | None:
        """The job's next due time; None (and an error logged) when it has none it can compute."""
        if planned.schedule.kind == "delay":
            return now
        try:
            return planned.schedule.next_after(self._plan_from(planned))
        except (OverflowError, ValueError) as exc:  # an interval past the end of the calendar
            logger.error(
                "job %r is not planned: its next occurrence cannot be computed (%s)",
                planned.name, exc, extra={**self.log_extra, "job": planned.name},
            )  # fmt: skip
            return None

    def _plan_from(self, planned: Planned) -> datetime:
        """Where this node plans a job from: after the job's mark (what is settled or was due
        before it last changed) and after what this node collected of it, or its own start.

        An occurrence between the last tick and a reload is still collected by the next tick;
        one after a change this node had not seen yet is claimed, late, if within the grace.
        """
        started = self._started_at or self.clock.now()
        return max(planned.definition.settled_through, self._collected.get(planned.name, started))

    def request_reload(self) -> None:
        self._reload.set()
        self._wake.set()

    def schedule_at(self, due: datetime, name: str) -> None:
        """Ask the loop (from any thread) to consider ``name`` again at ``due``."""
        self._inbox.put((due, name))
        self._wake.set()

    def wake_pending(self) -> None:
        """Ask the loop (from any thread) to look for pending runs now."""
        self._pending_due = self.clock.now()
        self._wake.set()

    def _plan_pending(self, now: datetime, next_due: datetime | None) -> None:
        """Look again when the next pending run is due; poll where nothing will notify us.

        A run still due after a pass could not be taken (no free thread, or its job or queue is
        at its limit): look again a poll interval later, or as soon as a thread here frees up,
        never in a busy loop.
        """
        poll = now + timedelta(seconds=app_settings.POLL_INTERVAL)
        self._pending_blocked = next_due is not None and next_due <= now
        if self._pending_blocked:
            next_due = poll
        listening = self.listener is not None and self.listener.healthy
        if not listening:
            next_due = min(next_due, poll) if next_due else poll
        self._pending_due = next_due

    def task_done(self, name: str = "") -> None:
        """A handler of job ``name`` finished here: claim what waited for it, and look for due
        pending runs now if they were waiting for a thread."""
        self._live_since.pop(name, None)
        for due in self._deferred.pop(name, []):
            self._released.put((due, name))
            self._wake.set()
        if self._pending_blocked:
            self.wake_pending()

    def _sleep(self) -> None:
        due = [d for d in (self.planner.next_due(), self._pending_due) if d is not None]
        timeout = MAX_SLEEP
        if due:
            timeout = min(timeout, max(0.0, (min(due) - self.clock.now()).total_seconds()))
        self._wake.wait(timeout)
        self._wake.clear()

    # -- one tick -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Claim every occurrence due now, in one batch; then start due pending runs.

        A database error anywhere in a tick is logged and the loop goes on: what could not be
        claimed was skipped (fail-closed), and a reload that failed is tried again next tick.
        """
        self.ticks += 1
        self._supervise()
        try:
            self._tick()
        except DatabaseError as exc:
            release_broken_connections()
            logger.warning(
                "tick of %s failed (fail-closed, retrying next tick): %s",
                self.node_id,
                exc,
                extra=self.log_extra,
            )
        except Exception:  # a last resort: each job and run is contained where it is handled
            logger.exception("tick of %s failed; re-planning every job", self.node_id,
                             extra=self.log_extra)  # fmt: skip
            self.request_reload()  # what this tick popped from the plan is planned again
            self._stopping.wait(TICK_BACKOFF)

    def _supervise(self) -> None:
        """Restart the heartbeat if its thread died; stop the node, failed, if it keeps dying:
        a node must never claim without heartbeating (others would take its runs over)."""
        if self.stopping or self.heartbeat.is_alive() or not self.heartbeat.started:
            return
        self.heartbeat_restarts += 1
        if self.heartbeat_restarts > MAX_RESTARTS:
            self.failure = "the heartbeat thread kept dying"
            logger.critical("node %s stops: %s", self.node_id, self.failure, extra=self.log_extra)
            self.request_stop(reason=self.failure)
            return
        logger.error("the heartbeat thread of %s died; restarting it", self.node_id,
                     extra=self.log_extra)  # fmt: skip
        self.heartbeat = self.heartbeat.restarted()
        self.heartbeat.start()

    def _tick(self) -> None:
        if self._reload.is_set():
            self.reload()
            self._reload.clear()
        while not self._inbox.empty():
            self.planner.push(*self._inbox.get())
        now = self.clock.now()
        claims, windows = self._collect(now)
        claims += self._released_claims(now)
        if claims:
            self._claim_due(claims, now)
        for planned, _ in windows:
            self._claim_window(planned, now)
        if self._pending_due is not None and self._pending_due <= now:
            self._take_pending(now)

    def fire_startup_jobs(self) -> None:
        now = self.clock.now()
        claims = [
            (
                p,
                Claim(
                    p.definition.pk,
                    f"startup:{self._claim_for(p, now).key}@{self.node_id}",
                    now,
                    Outcome.STARTUP,
                    p.definition.priority,
                    dict(p.definition.payload),
                ),
            )
            for p in self.planned.values()
            if p.schedule.kind == "startup" and p.definition.enabled
        ]
        if claims:
            self._claim_due(claims, now)


def sync_definitions(jobs: Iterable[Job], alias: str) -> None:
    """Upsert every code-declared job; an operator's enabled flag on an existing row is kept.

    A row of the same name that an operator created (source database) is never taken over: the
    code job is left out and the conflict logged (``manage.py check`` reports it too).
    """
    for declared in jobs:
        try:
            _sync_one(declared, alias)
        except DatabaseError as exc:
            if is_lock_timeout(exc):
                raise
            logger.error("job %r cannot be stored (%s); it is not scheduled", declared.name, exc,
                         extra={"job": declared.name})  # fmt: skip


def _sync_one(declared: Job, alias: str) -> None:
    fields = declared.definition_fields()
    with transaction.atomic(using=alias):
        row, created = JobDefinition.objects.using(alias).get_or_create(
            name=declared.name, defaults={**fields, "enabled": declared.enabled}
        )
        if created:
            return
        if row.source != Source.CODE:
            logger.error(
                "job %r is declared in code (%s) but an operator's database job has that name; "
                "the database job is kept and the code job is not scheduled",
                declared.name,
                declared.origin,
                extra={"job": declared.name},
            )
            return
        changed = [k for k, v in fields.items() if getattr(row, k) != v]
        if changed:
            for name in changed:
                setattr(row, name, fields[name])
            row.save(using=alias, update_fields=[*changed, "updated_at"])

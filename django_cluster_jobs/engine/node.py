"""The node: registers itself, plans due times, claims them in batches and runs what it won."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from datetime import datetime, timedelta
from importlib.metadata import PackageNotFoundError, version

from django.db import DatabaseError, transaction
from django.utils import timezone

from ..conf import app_settings
from ..coordination import Claim, Coordinator, Won, get_coordinator
from ..models import JobDefinition, NodeStatus, Outcome, WorkerNode
from ..registry import Registry, registry
from ..schedules import occurrence_key
from . import stats
from .clock import Clock
from .executor import Executor, release_broken_connections
from .heartbeat import HeartbeatThread
from .planner import Planned, Planner, load_planned
from .runner import Runner

logger = logging.getLogger(__name__)

#: An occurrence later than this when the loop reaches it is missed, not fired.
MISFIRE_GRACE = timedelta(seconds=5)
#: The longest the loop sleeps without a reason to wake.
MAX_SLEEP = 60.0


def package_version() -> str:
    try:
        return version("django-cluster-jobs")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


class Node:
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
        self.clock = clock or Clock()
        self.coordinator = coordinator or get_coordinator()
        self.tags = frozenset(app_settings.NODE_TAGS if tags is None else tags)
        self.registry = jobs
        self.executor = Executor(threads or app_settings.EXECUTOR_THREADS)
        self.runner = Runner(self.coordinator, self.clock, self.node_id)
        self.counters = stats.Counters()
        self.planner = Planner()
        self.planned: dict[str, Planned] = {}
        self.ticks = 0
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._inbox: queue.SimpleQueue[tuple[datetime, str]] = queue.SimpleQueue()
        self._reload = threading.Event()
        self.heartbeat = HeartbeatThread(self)

    @property
    def log_extra(self) -> dict[str, str]:
        return {"node": self.node_id}

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
        """Register the node, copy the code registry to the database, start the heartbeat."""
        self.register()
        sync_definitions(self.registry, self.coordinator.alias)
        self.reload()
        self.heartbeat.beat()
        self.heartbeat.start()
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

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Let running handlers finish within the grace period, then mark the node stopped."""
        self._stopping.set()
        grace = app_settings.GRACE_PERIOD
        if not self.executor.wait_idle(grace):
            logger.warning(
                "grace period of %ss over with runs still going; cancelling them",
                grace,
                extra=self.log_extra,
            )
            self.runner.cancel_all()
            self.executor.wait_idle(min(grace, 5.0))
        self.heartbeat.stop()
        self.executor.shutdown()
        self._mark(NodeStatus.STOPPED)
        release_broken_connections()
        logger.info("node %s stopped", self.node_id, extra=self.log_extra)

    def register(self) -> None:
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

    def _mark(self, status: str) -> None:
        try:
            WorkerNode.objects.using(self.coordinator.alias).filter(node_id=self.node_id).update(
                status=status,
                stopped_at=self.clock.now(),
                **self.counters.snapshot(self.clock.offset.total_seconds() * 1000).fields(),
            )
        except DatabaseError:
            logger.warning("could not mark node %s %s", self.node_id, status, exc_info=True)

    # -- planning -------------------------------------------------------------------------------

    def reload(self) -> None:
        """Reload definitions from the database and re-plan every job's next due time."""
        self.planned = {
            name: p
            for name, p in load_planned(self.coordinator.alias, self.registry).items()
            if p.runs_here(self.tags)
        }
        self.planner.clear()
        now = self.clock.now()
        for planned in self.planned.values():
            kind = planned.schedule.kind
            due = now if kind == "delay" else planned.schedule.next_after(now)
            if due is not None:
                self.planner.push(due, planned.name)

    def request_reload(self) -> None:
        self._reload.set()
        self._wake.set()

    def schedule_at(self, due: datetime, name: str) -> None:
        """Ask the loop (from any thread) to consider ``name`` again at ``due``."""
        self._inbox.put((due, name))
        self._wake.set()

    def _sleep(self) -> None:
        next_due = self.planner.next_due()
        timeout = MAX_SLEEP
        if next_due is not None:
            timeout = min(timeout, max(0.0, (next_due - self.clock.now()).total_seconds()))
        self._wake.wait(timeout)
        self._wake.clear()

    # -- one tick -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Claim every occurrence due now, in one batch, and hand the winners to the executor."""
        self.ticks += 1
        if self._reload.is_set():
            self._reload.clear()
            self.reload()
        while not self._inbox.empty():
            self.planner.push(*self._inbox.get())
        now = self.clock.now()
        claims, windows = self._collect(now)
        self._claim_slots(claims, now)
        for planned, due in windows:
            self._claim_window(planned, due, now)

    def _collect(
        self, now: datetime
    ) -> tuple[list[tuple[Planned, Claim]], list[tuple[Planned, datetime]]]:
        claims, windows = [], []
        for due, name in self.planner.pop_due(now):
            planned = self.planned.get(name)
            if planned is None:
                continue
            if planned.schedule.kind == "delay":
                windows.append((planned, due))
                continue
            self._push_next(planned, max(due, now - MISFIRE_GRACE))
            if self._skip_reason(planned, due, now) is None:
                claims.append((planned, self._claim_for(planned, due)))
        return claims, windows

    def _push_next(self, planned: Planned, after: datetime) -> None:
        following = planned.schedule.next_after(after)
        if following is not None:
            self.planner.push(following, planned.name)

    def _skip_reason(self, planned: Planned, due: datetime, now: datetime) -> str | None:
        reason = None
        if not planned.definition.enabled:
            reason = stats.DISABLED
        elif due < now - MISFIRE_GRACE:
            reason = stats.MISSED
        if reason is not None:
            self._skip(planned, occurrence_key(due), reason)
        return reason

    def _skip(self, planned: Planned, key: str, reason: str, n: int = 1) -> None:
        self.counters.add(skipped=reason, n=n)
        logger.debug(
            "skip %s @ %s: %s",
            planned.name,
            key,
            reason,
            extra={**self.log_extra, "job": planned.name, "occurrence": key},
        )

    def _claim_for(self, planned: Planned, due: datetime, outcome: str | None = None) -> Claim:
        definition = planned.definition
        key = occurrence_key(due)
        if definition.placement == "every_node" and outcome is None:
            key, outcome = f"{key}@{self.node_id}", Outcome.EVERY_NODE
        return Claim(
            definition.pk,
            key,
            due,
            outcome or Outcome.WON,
            definition.priority,
            dict(definition.payload or {}),
        )

    def _claim_slots(self, claims: list[tuple[Planned, Claim]], now: datetime) -> None:
        if not claims:
            return
        claims = self._fit_capacity(claims)
        by_key = {(c.job_id, c.key): (p, c) for p, c in claims}
        size = app_settings.CLAIM_BATCH_SIZE
        for start in range(0, len(claims), size):
            batch = [c for _, c in claims[start : start + size]]
            won = self._claim_batch(batch, by_key, now)
            for w in won:
                self._submit(w, *by_key[(w.job_id, w.key)])

    def _fit_capacity(self, claims: list[tuple[Planned, Claim]]) -> list[tuple[Planned, Claim]]:
        """Keep what the executor can start now; every-node claims first, the rest skipped."""
        if self.stopping:
            for planned, claim in claims:
                self._skip(planned, claim.key, stats.DRAINING)
            return []
        claims = sorted(
            claims, key=lambda pc: (pc[1].outcome != Outcome.EVERY_NODE, -pc[1].priority)
        )
        free = self.executor.free
        for planned, claim in claims[free:]:
            self._skip(planned, claim.key, stats.NODE_BUSY)
        return claims[:free]

    def _claim_batch(self, batch: list[Claim], by_key: dict, now: datetime) -> list[Won]:
        lease_until = now + timedelta(seconds=app_settings.LEASE_TTL)
        try:
            won = self.coordinator.claim(batch, self.node_id, now, lease_until)
        except DatabaseError as exc:
            release_broken_connections()
            for claim in batch:
                planned = by_key[(claim.job_id, claim.key)][0]
                self._skip(planned, claim.key, stats.CLAIM_FAILED)
                logger.warning(
                    "claim failed, skipping %s @ %s (fail-closed): %s",
                    planned.name,
                    claim.key,
                    exc,
                    extra={**self.log_extra, "job": planned.name, "occurrence": claim.key},
                )
            return []
        won_keys = {(w.job_id, w.key) for w in won}
        for claim in batch:
            if (claim.job_id, claim.key) not in won_keys:
                self.counters.add(lost=1)
                self._skip(by_key[(claim.job_id, claim.key)][0], claim.key, stats.CLAIMED_ELSEWHERE)
        self.counters.add(won=len(won))
        return won

    def _claim_window(self, planned: Planned, due: datetime, now: datetime) -> None:
        interval = planned.schedule.interval  # type: ignore[attr-defined]
        recheck = timedelta(seconds=app_settings.HEARTBEAT_INTERVAL)
        if self.stopping or not planned.definition.enabled or self.executor.free < 1:
            self.planner.push(now + min(interval, recheck), planned.name)
            return
        lease_until = now + timedelta(seconds=app_settings.LEASE_TTL)
        key = occurrence_key(now)
        try:
            result = self.coordinator.claim_window(
                planned.definition.pk, interval, key, self.node_id, now, lease_until, recheck
            )
        except DatabaseError as exc:
            release_broken_connections()
            self._skip(planned, key, stats.CLAIM_FAILED)
            logger.warning(
                "window claim failed for %s (fail-closed): %s",
                planned.name,
                exc,
                extra={**self.log_extra, "job": planned.name},
            )
            self.planner.push(now + recheck, planned.name)
            return
        if result.won is None:
            self.planner.push(result.next_check or now + recheck, planned.name)
            return
        self.counters.add(won=1)
        claim = Claim(
            planned.definition.pk,
            key,
            now,
            Outcome.WON,
            planned.definition.priority,
            dict(planned.definition.payload or {}),
        )
        self._submit(
            result.won,
            planned,
            claim,
            on_done=lambda finished: self.schedule_at(finished + interval, planned.name),
        )

    def _submit(self, won: Won, planned: Planned, claim: Claim, on_done=None) -> None:
        logger.info(
            "won %s @ %s",
            planned.name,
            won.key,
            extra={
                **self.log_extra,
                "job": planned.name,
                "occurrence": won.key,
                "fence": won.fence,
            },
        )
        task = lambda: self.runner.run(won, planned, claim.scheduled_at, claim.payload, on_done)  # noqa: E731
        if not self.executor.submit(task):  # capacity is checked before claiming; never expected
            logger.error(
                "executor full after claiming %s @ %s; running it on a spare thread",
                planned.name,
                won.key,
                extra=self.log_extra,
            )
            threading.Thread(target=task, daemon=True).start()

    def fire_startup_jobs(self) -> None:
        now = self.clock.now()
        startup = [p for p in self.planned.values() if p.schedule.kind == "startup"]
        claims = [
            (p, self._claim_for(p, now, Outcome.STARTUP)) for p in startup if p.definition.enabled
        ]
        claims = [
            (
                p,
                Claim(
                    c.job_id,
                    f"startup:{c.key}@{self.node_id}",
                    now,
                    Outcome.STARTUP,
                    c.priority,
                    c.payload,
                ),
            )
            for p, c in claims
        ]
        self._claim_slots(claims, now)


def sync_definitions(jobs: Registry, alias: str) -> None:
    """Upsert every code-declared job; an operator's enabled flag on an existing row is kept."""
    for declared in jobs:
        fields = declared.definition_fields()
        with transaction.atomic(using=alias):
            row, created = JobDefinition.objects.using(alias).get_or_create(
                name=declared.name, defaults={**fields, "enabled": declared.enabled}
            )
            changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
            if not created and changed:
                JobDefinition.objects.using(alias).filter(pk=row.pk).update(
                    **changed, updated_at=timezone.now()
                )

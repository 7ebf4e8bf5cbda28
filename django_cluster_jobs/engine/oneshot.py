"""Run one occurrence of a job in the foreground, claimed through the ledger (``runjob``).

An external clock (a Kubernetes CronJob, a systemd timer) starts ``manage.py runjob`` at each
tick. The arrival time is snapped to the nearest occurrence of the job's schedule and claimed
under that occurrence's key, the key every scheduler node would claim, so a doubled delivery (or
a scheduler firing the same occurrence) runs it once. The occurrence key is:

- cron and fixed-rate jobs: the nearest occurrence's, e.g. ``2026-05-28T09:00:00Z``;
- on-demand, startup and fixed-delay jobs, which have no slots: ``external:`` and the arrival
  instant rounded to the nearest second, so deliveries that agree on ``--at`` run once (two
  deliveries without ``--at`` dedupe only when they fall in the same second);
- with an explicit key, for any job: ``external:<key>``.

The run goes through the engine's Runner, so its row, fence, events, retries and write-back are
the scheduler's; its lease is renewed while the handler runs.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections

from ..conf import app_settings
from ..coordination import Claim, Coordinator, NodeStats, Won, get_coordinator
from ..exceptions import UnknownJob
from ..models import EventKind, JobDefinition, JobRun, Outcome, RunEvent, RunState
from ..registry import check_payload, registry
from ..schedules import occurrence_key
from .clock import Clock
from .executor import release_broken_connections
from .node import default_clock, sync_definitions
from .planner import Planned
from .runner import Runner

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What ``runjob`` did: the occurrence, the run that holds it and how this attempt ended."""

    job: str
    key: str
    scheduled_at: datetime
    ran: bool  # True when this process ran the handler
    run_id: int | None = None  # the run holding the occurrence: ours, or another's
    node: str = ""  # the node holding it
    state: str = ""  # the run's state now (pending again when a retry is due)
    ended: str = ""  # how this attempt ended: succeeded, failed, timed_out, fenced_out, …
    error: str = ""
    reason: str = ""  # why it did not run

    @property
    def ok(self) -> bool:
        """False only when this process ran the handler and the attempt did not succeed."""
        return not self.ran or self.ended == RunState.SUCCEEDED


def round_second(at: datetime) -> datetime:
    """Return ``at`` rounded to the nearest whole second."""
    return (at + timedelta(microseconds=500_000)).replace(microsecond=0)


def resolve(name: str, alias: str) -> Planned:
    """Return the job ``name``: a code job (its row synced first) or a database job naming one."""
    if name in registry:
        sync_definitions([registry.get(name)], alias)  # type: ignore[arg-type]
    definition = JobDefinition.objects.using(alias).filter(name=name).first()
    if definition is None or definition.callable_name not in registry:
        stored = JobDefinition.objects.using(alias).filter(callable_name__in=registry.names())
        raise UnknownJob(name, sorted({*registry.names(), *stored.values_list("name", flat=True)}))
    return Planned(definition, registry.get(definition.callable_name), definition.get_schedule())


class LeaseKeeper(threading.Thread):
    """Renew the run's lease every heartbeat interval; flag the handler if the run is cancelled
    by an operator or taken away (its lease expired while this process was stalled)."""

    def __init__(self, shot: OneShot, run_id: int) -> None:
        super().__init__(name=f"cluster-jobs-lease-{run_id}", daemon=True)
        self.shot, self.run_id = shot, run_id
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.wait(app_settings.HEARTBEAT_INTERVAL):
                self.beat()
        finally:
            connections.close_all()

    def beat(self) -> None:
        shot, now = self.shot, self.shot.clock.now()
        try:
            beat = shot.coordinator.heartbeat(
                shot.node_id, now, shot.lease_until(now), NodeStats(), [self.run_id]
            )
        except DatabaseError as exc:
            release_broken_connections()
            logger.warning("could not renew the lease of run %s: %s", self.run_id, exc)
            return
        if self.run_id in beat.cancel_requested:
            shot.runner.cancel({self.run_id}, why="cancel")
        elif self.run_id not in beat.owned_runs:
            shot.runner.cancel({self.run_id}, why="lost")

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=app_settings.HEARTBEAT_INTERVAL + 5)


class OneShot:
    """One job, run once in this process; drive it with :meth:`run`."""

    def __init__(
        self,
        name: str,
        *,
        node_id: str | None = None,
        clock: Clock | None = None,
        coordinator: Coordinator | None = None,
    ) -> None:
        self.coordinator = coordinator or get_coordinator()
        self.alias = self.coordinator.alias
        self.node_id = node_id or app_settings.node_id()
        self.clock = clock or default_clock()
        self.planned = resolve(name, self.alias)
        self.runner = Runner(self.coordinator, self.clock, self.node_id)

    @property
    def name(self) -> str:
        return self.planned.name

    def lease_until(self, now: datetime) -> datetime:
        return now + timedelta(seconds=app_settings.LEASE_TTL)

    def occurrence(
        self, at: datetime | None = None, key: str | None = None
    ) -> tuple[datetime, str]:
        """Return the occurrence an arrival at ``at`` (default: now) stands for, and its key."""
        arrival = at or self.clock.now()
        schedule = self.planned.schedule
        instant = schedule.snap(arrival) if schedule.slotted else round_second(arrival)
        if key:
            return instant, f"{Outcome.EXTERNAL}:{key}"
        if schedule.slotted:
            return instant, occurrence_key(instant)
        return instant, f"{Outcome.EXTERNAL}:{occurrence_key(instant)}"

    def run(
        self, payload: dict | None = None, *, at: datetime | None = None, key: str | None = None
    ) -> Result:
        """Claim the occurrence at ``at`` (default: now) and, if this process wins it, run it."""
        definition = self.planned.definition
        merged = check_payload(self.name, {**(definition.payload or {}), **(payload or {})})
        scheduled_at, run_key = self.occurrence(at, key)
        self._observe_clock()
        now = self.clock.now()
        blocked = self._blocked(now)
        if blocked:
            return Result(self.name, run_key, scheduled_at, ran=False, reason=blocked)
        claim = Claim(
            definition.pk, run_key, scheduled_at, Outcome.EXTERNAL, definition.priority, merged
        )
        won = self.coordinator.claim([claim], self.node_id, now, self.lease_until(now))
        if not won:
            return self._held_elsewhere(run_key, scheduled_at)
        self._execute(won[0], scheduled_at, merged)
        return self._result(won[0], scheduled_at)

    def cancel(self) -> None:
        """Flag the running handler as cancelled (SIGTERM); it should return soon."""
        self.runner.cancel(why="shutdown")

    def _observe_clock(self) -> None:
        sent = self.clock.local()
        try:
            db_time = self.coordinator.db_now()
        except DatabaseError:  # the claim that follows fails loudly if the database is gone
            return
        if db_time is not None:
            self.clock.observe(sent, db_time, self.clock.local())

    def _blocked(self, now: datetime) -> str:
        definition = self.planned.definition
        if not definition.enabled:
            return "the job is disabled"
        if definition.paused_until is not None and definition.paused_until > now:
            return f"the job is paused until {definition.paused_until.isoformat()}"
        return ""

    def _execute(self, won: Won, scheduled_at: datetime, payload: dict) -> None:
        keeper = LeaseKeeper(self, won.run_id)
        keeper.start()
        try:
            self.runner.run(won, self.planned, scheduled_at, payload)
        finally:
            keeper.stop()

    def _held_elsewhere(self, key: str, scheduled_at: datetime) -> Result:
        row = (
            JobRun.objects.using(self.alias)
            .filter(job_id=self.planned.definition.pk, key=key)
            .values("pk", "node", "state")
            .first()
        )
        if row is None:  # refused by the database gate: disabled, paused, or overlap
            live = self.coordinator.live_laned({self.planned.definition.pk})
            reason = "not claimed: the job is disabled or paused"
            if live:
                reason = f"not claimed: overlap, the previous run ({live.popitem()[1]}) is live"
            return Result(self.name, key, scheduled_at, ran=False, reason=reason)
        return Result(
            self.name,
            key,
            scheduled_at,
            ran=False,
            run_id=row["pk"],
            node=row["node"],
            state=row["state"],
            reason="already claimed",
        )

    def _result(self, won: Won, scheduled_at: datetime) -> Result:
        run = JobRun.objects.using(self.alias).get(pk=won.run_id)
        return Result(
            self.name,
            won.key,
            scheduled_at,
            ran=True,
            run_id=run.pk,
            node=self.node_id,
            state=run.state,
            ended=self._ended(won),
            error=run.error.splitlines()[0] if run.error else "",
        )

    def _ended(self, won: Won) -> str:
        """How this attempt ended: the outcome this node recorded under the attempt's fence."""
        kinds = (
            RunEvent.objects.using(self.alias)
            .filter(run_id=won.run_id, node=self.node_id, fence=won.fence)
            .exclude(kind__in=(EventKind.CLAIMED, EventKind.STARTED))
            .order_by("-at", "-pk")
            .values_list("kind", flat=True)
        )
        return kinds.first() or "unrecorded"


def run_job(name: str, payload: dict[str, Any] | None = None, **options: Any) -> Result:
    """Run one occurrence of ``name`` in the foreground; see :class:`OneShot` for the options."""
    at, key = options.pop("at", None), options.pop("key", None)
    return OneShot(name, **options).run(payload, at=at, key=key)

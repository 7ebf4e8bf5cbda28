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
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DatabaseError

from ..conf import app_settings
from ..coordination import Claim, NodeStats, Refusal, Won
from ..exceptions import UnknownJob
from ..ledger import Ledger, get_ledger
from ..ledger.leases import lease_ttl, lease_until
from ..models import EventKind, JobDefinition, JobRun, Outcome, RunEvent, RunState
from ..policies.overlap import gate_of
from ..registry import check_payload, registry
from ..schedules import occurrence_key
from .clock import Clock, align
from .executor import release_broken_connections
from .handlers import merged_payload
from .node import default_clock
from .periodic import PeriodicThread
from .planner import Planned
from .registration import sync_definitions
from .runner import Runner, Stop

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


#: How a refused claim is worded (GateState.refusal's codes).
REFUSALS = {
    Refusal.DISABLED: "the job is disabled",
    Refusal.PAUSED: "the job is paused",
    Refusal.SETTLED: "the occurrence is already settled (claimed, or recorded missed)",
    Refusal.CHANGED: "the job's definition changed while it was claimed; run it again",
}


def schedule_slot(planned: Planned, key: str | None) -> bool:
    """True when runjob claims an occurrence of the job's schedule, not an external key."""
    return planned.schedule.slotted and not key


def round_second(at: datetime) -> datetime:
    """Return ``at`` rounded to the nearest whole second."""
    return (at + timedelta(microseconds=500_000)).replace(microsecond=0)


def resolve(name: str, alias: str) -> Planned:
    """Return the job ``name``: a code job (its row synced first) or a database job naming one."""
    if name in registry:
        sync_definitions([registry.get(name)], alias)
    definition = JobDefinition.objects.using(alias).filter(name=name).first()
    if definition is None or definition.callable_name not in registry:
        stored = JobDefinition.objects.using(alias).filter(callable_name__in=registry.names())
        raise UnknownJob(name, sorted({*registry.names(), *stored.values_list("name", flat=True)}))
    leads = JobDefinition.objects.using(alias).dependents_of(name).exists()
    job, schedule = registry.get(definition.callable_name), definition.get_schedule()
    return Planned(definition, job, schedule, leads=leads)


class LeaseKeeper(PeriodicThread):
    """Renew the run's lease every heartbeat interval; flag the handler if the run is cancelled
    by an operator or taken away (its lease expired while this process was stalled)."""

    what = "lease keeper"

    def __init__(self, shot: OneShot, won: Won) -> None:
        super().__init__(name=f"cluster-jobs-lease-{won.run_id}")
        self.shot, self.run_id, self.fence = shot, won.run_id, won.fence

    def interval(self) -> float:
        return app_settings.HEARTBEAT_INTERVAL

    def step(self) -> None:
        shot, now = self.shot, self.shot.clock.now()
        beat = shot.ledger.vendor.heartbeat(
            shot.node_id, now, lease_until(now), NodeStats(), [(self.run_id, self.fence)]
        )
        if self.run_id in beat.cancel_requested:
            shot.runner.cancel({self.run_id}, why=Stop.CANCEL)
        elif self.run_id not in beat.owned_runs:
            shot.runner.cancel({self.run_id}, why=Stop.LOST)


class OneShot:
    """One job, run once in this process; drive it with :meth:`run`."""

    def __init__(
        self,
        name: str,
        *,
        node_id: str | None = None,
        clock: Clock | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.ledger = ledger or get_ledger()
        self.alias = self.ledger.alias
        self.node_id = node_id or app_settings.node_id()
        self.clock = clock or default_clock()
        self.planned = resolve(name, self.alias)
        self.runner = Runner(self.ledger, self.clock, self.node_id)

    @property
    def name(self) -> str:
        return self.planned.name

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
        merged = check_payload(self.name, merged_payload(definition.payload, payload))
        scheduled_at, run_key = self.occurrence(at, key)
        self._observe_clock()
        now = self.clock.now()
        blocked = self._blocked(now)
        if blocked:
            return Result(self.name, run_key, scheduled_at, ran=False, reason=blocked)
        slot = schedule_slot(self.planned, key)
        claim = Claim(
            definition.pk, run_key, scheduled_at, Outcome.EXTERNAL, definition.priority, merged,
            slot=slot, revision=definition.revision,
        )  # fmt: skip
        won = self._claim(claim, now)
        if isinstance(won, Result):
            return won
        self._execute(won, scheduled_at, merged)
        return self._result(won, scheduled_at)

    def _claim(self, claim: Claim, now: datetime) -> Won | Result:
        """Claim through the same gates as a scheduler node (overlap, concurrency, queues)."""
        gate = gate_of(self.planned.definition)
        if gate is None:
            won = self.ledger.vendor.claim([claim], self.node_id, now, lease_until(now))
            return won[0] if won else self._held_elsewhere(claim, now)
        result = self.ledger.gates.claim_gated(
            claim, gate, self.node_id, self.clock.now, lease_ttl()
        )
        if result.won is not None:
            return result.won
        if result.buffered:
            reason = "buffered: a node runs it as soon as the live run of the job ends"
            return Result(self.name, claim.key, claim.scheduled_at, ran=False, reason=reason)
        if result.refusal is not None:
            self.ledger.gates.record_skip(claim, self.node_id, now, result.reason)
            reason = f"not claimed: {result.reason}"
            return Result(self.name, claim.key, claim.scheduled_at, ran=False, reason=reason)
        return self._held_elsewhere(claim, now)

    def cancel(self) -> None:
        """Flag the running handler as cancelled (SIGTERM); it should return soon."""
        self.runner.cancel(why=Stop.SHUTDOWN)

    def _observe_clock(self) -> None:
        try:
            align(self.clock, self.ledger.vendor)
        except DatabaseError:  # the claim that follows fails loudly if the database is gone
            release_broken_connections()

    def _blocked(self, now: datetime) -> str:
        definition = self.planned.definition
        if not definition.enabled:
            return "the job is disabled"
        if definition.is_paused_at(now) and definition.paused_until is not None:
            return f"the job is paused until {definition.paused_until.isoformat()}"
        return ""

    def _execute(self, won: Won, scheduled_at: datetime, payload: dict) -> None:
        keeper = LeaseKeeper(self, won)
        keeper.start()
        try:
            self.runner.run(won, self.planned, scheduled_at, payload)
        finally:
            keeper.stop()

    def _held_elsewhere(self, claim: Claim, now: datetime) -> Result:
        key, scheduled_at = claim.key, claim.scheduled_at
        row = (
            JobRun.objects.using(self.alias)
            .filter(job_id=self.planned.definition.pk, key=key)
            .values("pk", "node", "state")
            .first()
        )
        if row is None:  # refused by the database gate: disabled, paused, settled or overlap
            gate = self.ledger.gates.gate_states({claim.job_id}).get(claim.job_id)
            refusal = gate.refusal(claim, now) if gate is not None else Refusal.DISABLED
            reason = f"not claimed: {REFUSALS.get(refusal, refusal)}" if refusal else "not claimed"
            if refusal == Refusal.OVERLAP and gate is not None:
                reason = f"not claimed: overlap, the previous run ({gate.live_key}) is live"
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

"""The claimer: the occurrences a node plans, and what one tick claims of them.

It keeps the node's plan (a heap of next fire times, what it collected of each job, the runs it
holds back) and, at each tick, claims every occurrence due in one batch where the database gate
decides alone, one by one under locks where a policy needs them, and fixed-delay windows. What
it claims it hands to the node to start; what the gate refused it counts by reason.
"""

from __future__ import annotations

import logging
import queue
from datetime import datetime, timedelta

from django.db import DatabaseError

from .. import signals
from ..conf import app_settings
from ..coordination import Claim, Refusal, Won
from ..ledger.leases import lease_ttl, lease_until
from ..models import Outcome, Placement, ScheduleKind
from ..policies.overlap import gate_of, takes_lane
from ..schedules import Delay, occurrence_key
from . import stats
from .executor import release_broken_connections
from .planner import Planned, Planner
from .protocols import ClaimerHost

logger = logging.getLogger("django_cluster_jobs.engine.node")

#: An occurrence later than this when the loop reaches it is missed, not fired.
MISFIRE_GRACE = timedelta(seconds=5)
_INSTANT = timedelta(microseconds=1)

Pair = tuple[Planned, Claim]


class Claimer:
    """Plans a node's jobs and claims their occurrences; thread-safe where noted."""

    def __init__(self, host: ClaimerHost) -> None:
        self.host = host
        self.planner = Planner()
        #: The jobs this node fires, by name, and by definition id.
        self.planned: dict[str, Planned] = {}
        self.by_pk: dict[int, Planned] = {}
        #: This node's start in cluster time: it plans each job from the later of the job's mark
        #: and what it collected of it, or this instant.
        self.started_at: datetime | None = None
        #: Per job, the latest occurrence this node claimed or decided to leave.
        self.collected: dict[str, datetime] = {}
        #: Per no-overlap job, when this node started its live run of it; and the occurrences
        #: held back until that run ends (see :meth:`_held_back`).
        self.live_since: dict[str, datetime] = {}
        self.deferred: dict[str, list[datetime]] = {}
        self._released: queue.SimpleQueue[tuple[datetime, str]] = queue.SimpleQueue()
        self._inbox: queue.SimpleQueue[tuple[datetime, str]] = queue.SimpleQueue()

    # -- the plan -----------------------------------------------------------------------------

    def replan(self, planned: dict[str, Planned], now: datetime) -> None:
        """Plan these jobs again, each from :meth:`plan_from`."""
        self.planned = planned
        self.by_pk = {job.definition.pk: job for job in planned.values()}
        self.planner.clear()
        for job in planned.values():
            self._plan_first(job, now)

    def replan_changed(self, changed: dict[str, Planned], dropped: set[str], now: datetime) -> None:
        """Plan again only the jobs that changed (each from :meth:`plan_from`), and stop
        planning the ``dropped`` ones; every other job keeps its place in the plan."""
        for name in dropped | changed.keys():
            self.planner.forget(name)
            gone = self.planned.pop(name, None)
            if gone is not None:
                self.by_pk.pop(gone.definition.pk, None)
        for job in changed.values():
            self.planned[job.name] = self.by_pk[job.definition.pk] = job
            self._plan_first(job, now)

    def _plan_first(self, job: Planned, now: datetime) -> None:
        due = self._first_due(job, now)
        if due is not None:
            self.planner.push(due, job.name)

    def plan_from(self, planned: Planned) -> datetime:
        """Where this node plans a job from: after the job's mark (what is settled or was due
        before it last changed) and after what this node collected of it, or its own start.

        An occurrence between the last tick and a reload is still collected by the next tick;
        one after a change this node had not seen yet is claimed, late, if within the grace.
        """
        started = self.started_at or self.host.clock.now()
        return max(planned.definition.settled_through, self.collected.get(planned.name, started))

    def _first_due(self, planned: Planned, now: datetime) -> datetime | None:
        """The job's next due time; None (and an error logged) when it has none it can compute."""
        if planned.schedule.kind == ScheduleKind.DELAY:
            return now
        try:
            return planned.schedule.next_after(self.plan_from(planned))
        except (OverflowError, ValueError) as exc:  # an interval past the end of the calendar
            logger.error(
                "job %r is not planned: its next occurrence cannot be computed (%s)",
                planned.name, exc, extra={**self.host.log_extra, "job": planned.name},
            )  # fmt: skip
            return None

    def next_due(self) -> datetime | None:
        return self.planner.next_due()

    def schedule_at(self, due: datetime, name: str) -> None:
        """Consider ``name`` again at ``due`` (from any thread)."""
        self._inbox.put((due, name))
        self.host.wake.set()

    def run_ended(self, name: str) -> None:
        """A run of ``name`` ended on this node: claim what waited for it (from any thread)."""
        self.live_since.pop(name, None)
        for due in self.deferred.pop(name, []):
            self._released.put((due, name))
            self.host.wake.set()

    def run_started(self, planned: Planned) -> None:
        """A run of ``planned`` starts on this node now."""
        if self._laned(planned):
            self.live_since[planned.name] = self.host.clock.now()

    # -- one tick -----------------------------------------------------------------------------

    def tick(self, now: datetime) -> None:
        """Claim every occurrence due at ``now``: slots in batches, gated ones, windows."""
        while not self._inbox.empty():
            self.planner.push(*self._inbox.get())
        claims, windows = self._collect(now)
        claims += self._released_claims(now)
        if claims:
            self._claim_due(claims, now)
        for planned in windows:
            self._claim_window(planned, now)

    def fire_startup_jobs(self, now: datetime) -> None:
        """Claim the startup jobs' run of this node (their keys are this node's own)."""
        node = self.host.node_id
        claims = [
            (p, self._claim_for(p, now, Outcome.STARTUP, f"startup:{occurrence_key(now)}@{node}"))
            for p in self.planned.values()
            if p.schedule.kind == ScheduleKind.STARTUP and p.definition.enabled
        ]
        if claims:
            self._claim_due(claims, now)

    def _collect(self, now: datetime) -> tuple[list[Pair], list[Planned]]:
        claims, windows = [], []
        for due, name in self.planner.pop_due(now):
            planned = self.planned.get(name)
            if planned is None:
                continue
            if planned.schedule.kind == ScheduleKind.DELAY:
                windows.append(planned)
                continue
            if self._held_back(planned, due, now):
                continue
            self.collected[name] = max(due, self.collected.get(name, due))
            self._push_next(planned, max(due, now - MISFIRE_GRACE))
            if not self._too_late(planned, due, now):
                claims.append((planned, self._claim_for(planned, due)))
        return claims, windows

    def _held_back(self, planned: Planned, due: datetime, now: datetime) -> bool:
        """Skip the occurrences of a disabled or paused job without counting them as collected,
        and hold back one that fell due before this node started its live run of the job.

        A disabled job is planned again when it is enabled (the change reloads every node), a
        paused one from the end of its pause. An occurrence due before this node's own live run
        of a no-overlap job began does not overlap it: it is claimed when that run ends.
        """
        definition, name = planned.definition, planned.name
        paused_until = definition.paused_until
        if not definition.enabled or (paused_until is not None and paused_until > now):
            reason = stats.DISABLED if not definition.enabled else stats.PAUSED
            self._skip(planned, occurrence_key(due), reason)
            if definition.enabled and paused_until is not None:
                self._push_next(planned, max(due, paused_until - _INSTANT))
            return True
        began = self.live_since.get(name)
        laned = gate_of(definition) is None and self._laned(planned)
        if began is not None and due < began and laned:
            self._skip(planned, occurrence_key(due), stats.DEFERRED)
            self.deferred.setdefault(name, []).append(due)
            self._push_next(planned, max(due, now - MISFIRE_GRACE))
            return True
        return False

    def _released_claims(self, now: datetime) -> list[Pair]:
        """Claims of the occurrences held back until this node's live run of their job ended."""
        claims = []
        while not self._released.empty():
            due, name = self._released.get()
            planned = self.planned.get(name)
            if planned is not None and not self._too_late(planned, due, now):
                claims.append((planned, self._claim_for(planned, due)))
        return claims

    @staticmethod
    def _laned(planned: Planned) -> bool:
        return takes_lane(planned.definition, Outcome.WON)

    def _push_next(self, planned: Planned, after: datetime) -> None:
        """Plan the job's next occurrence after ``after`` (none past the end of the calendar)."""
        try:
            following = planned.schedule.next_after(after)
        except (OverflowError, ValueError):
            following = None
        if following is not None:
            self.planner.push(following, planned.name)

    def _too_late(self, planned: Planned, due: datetime, now: datetime) -> bool:
        """Skip an occurrence too late to claim: the leader settles it by the misfire policy."""
        if due < now - MISFIRE_GRACE:
            self._skip(planned, occurrence_key(due), stats.MISSED)
            return True
        return False

    def _skip(self, planned: Planned, key: str, reason: str) -> None:
        self.host.counters.add(skipped=reason)
        extra = {**self.host.log_extra, "job": planned.name, "occurrence": key}
        logger.debug("skip %s @ %s: %s", planned.name, key, reason, extra=extra)

    def _claim_for(
        self, planned: Planned, due: datetime, outcome: str | None = None, key: str | None = None
    ) -> Claim:
        definition = planned.definition
        slot = key is None and planned.schedule.slotted
        key = key or occurrence_key(due)
        if definition.placement == Placement.EVERY_NODE and outcome is None:
            key, outcome = f"{key}@{self.host.node_id}", Outcome.EVERY_NODE
        return Claim(
            definition.pk,
            key,
            due,
            outcome or Outcome.WON,
            definition.priority,
            definition.default_payload(),
            slot=slot,
            revision=definition.revision,
        )

    # -- claiming -----------------------------------------------------------------------------

    def _claim_due(self, claims: list[Pair], now: datetime) -> None:
        """Batch-claim what the database gate can decide alone; gate the rest one by one."""
        gated = [(p, c) for p, c in claims if gate_of(p.definition) is not None]
        batched = [(p, c) for p, c in claims if gate_of(p.definition) is None]
        if batched:
            self._claim_slots(batched, now)
        for planned, claim in self._fit_capacity(gated):
            self._claim_gated(planned, claim, now)

    def _claim_slots(self, claims: list[Pair], now: datetime) -> None:
        claims = self._fit_capacity(claims)
        by_key = {(c.job_id, c.key): (p, c) for p, c in claims}
        size = app_settings.CLAIM_BATCH_SIZE
        for start in range(0, len(claims), size):
            batch = [c for _, c in claims[start : start + size]]
            for won in self._claim_batch(batch, by_key, now):
                planned, claim = by_key[(won.job_id, won.key)]
                self.host.start_run(won, planned, claim.scheduled_at, claim.payload)

    def _fit_capacity(self, claims: list[Pair]) -> list[Pair]:
        """Keep what the executor can start now (every-node first); skip the rest with a reason."""
        reason, free = stats.NODE_BUSY, self.host.free_threads()
        if self.host.stopping:
            reason, free = stats.DRAINING, 0
        claims = sorted(
            claims, key=lambda pc: (pc[1].outcome != Outcome.EVERY_NODE, -pc[1].priority)
        )
        for planned, claim in claims[free:]:
            self._skip(planned, claim.key, reason)
        return claims[:free]

    def _claim_batch(
        self, batch: list[Claim], by_key: dict[tuple[int, str], Pair], now: datetime
    ) -> list[Won]:
        try:
            won = self.host.ledger.vendor.claim(batch, self.host.node_id, now, lease_until(now))
        except DatabaseError as exc:
            release_broken_connections()
            for claim in batch:
                self._claim_failed(by_key[(claim.job_id, claim.key)][0], claim.key, exc)
            return []
        won_keys = {(w.job_id, w.key) for w in won}
        lost = [by_key[(c.job_id, c.key)] for c in batch if (c.job_id, c.key) not in won_keys]
        self.host.counters.add(won=len(won))
        self._settle_losers(lost, now)
        return won

    def _settle_losers(self, lost: list[Pair], now: datetime) -> None:
        """Count each claim the gate refused by its reason; record the ones a live run refused
        (overlap); the rest were claimed by another node."""
        if not lost:
            return
        gates = self.host.ledger.gates.gate_states({c.job_id for _, c in lost})
        for planned, claim in lost:
            gate = gates.get(claim.job_id)
            refusal = gate.refusal(claim, now) if gate is not None else Refusal.DISABLED
            if refusal == Refusal.OVERLAP and gate is not None:
                why = f"overlap: the previous run is still live ({gate.live_key})"
                self._record_skip(planned, claim, now, why, refusal)
            elif refusal == Refusal.CHANGED:
                self._replan_after(planned, claim)
            elif refusal is not None:
                self._skip(planned, claim.key, refusal)
            else:
                self.host.counters.add(lost=1)
                self._skip(planned, claim.key, stats.CLAIMED_ELSEWHERE)

    def _replan_after(self, planned: Planned, claim: Claim) -> None:
        """This node planned from a definition changed since: forget it collected the refused
        occurrence and re-plan at once, so the change's own first occurrences are claimed."""
        self._skip(planned, claim.key, Refusal.CHANGED)
        collected = self.collected.get(planned.name, claim.scheduled_at)
        self.collected[planned.name] = min(collected, claim.scheduled_at - _INSTANT)
        self.host.request_reload({planned.name})

    def _record_skip(
        self, planned: Planned, claim: Claim, now: datetime, reason: str, counter: str
    ) -> None:
        self._skip(planned, claim.key, counter)
        run = self.host.ledger.gates.record_skip(claim, self.host.node_id, now, reason)
        if run is not None:
            signals.send(signals.run_skipped, planned.name, run_id=run.pk, key=claim.key,
                         node=self.host.node_id, attempt=0, reason=reason)  # fmt: skip

    def _claim_gated(self, planned: Planned, claim: Claim, now: datetime) -> None:
        gate = gate_of(planned.definition)
        assert gate is not None
        try:
            result = self.host.ledger.gates.claim_gated(
                claim, gate, self.host.node_id, self.host.clock.now, lease_ttl()
            )
        except DatabaseError as exc:
            release_broken_connections()
            self._claim_failed(planned, claim.key, exc)
            return
        if result.won is not None:
            self.host.counters.add(won=1)
            self.host.start_run(result.won, planned, claim.scheduled_at, claim.payload)
        elif result.buffered:
            self._skip(planned, claim.key, stats.BUFFERED)
        elif result.refusal is not None:
            self._record_skip(planned, claim, now, result.reason, result.refusal)
        else:
            self.host.counters.add(lost=1)
            self._skip(planned, claim.key, stats.CLAIMED_ELSEWHERE)

    def _claim_failed(self, planned: Planned, key: str, exc: Exception) -> None:
        self._skip(planned, key, stats.CLAIM_FAILED)
        logger.warning(
            "claim failed, skipping %s @ %s (fail-closed): %s", planned.name, key, exc,
            extra={**self.host.log_extra, "job": planned.name, "occurrence": key},
        )  # fmt: skip

    def _claim_window(self, planned: Planned, now: datetime) -> None:
        schedule = planned.schedule
        assert isinstance(schedule, Delay)  # _collect hands over the fixed-delay jobs only
        interval = schedule.interval
        recheck = timedelta(seconds=app_settings.HEARTBEAT_INTERVAL)
        busy = self.host.stopping or self.host.free_threads() < 1
        if busy or not planned.definition.enabled:
            self.planner.push(now + min(interval, recheck), planned.name)
            return
        key = occurrence_key(now)
        try:
            result = self.host.ledger.gates.claim_window(
                planned.definition.pk, interval, key, self.host.node_id, now, lease_until(now),
                recheck,
            )  # fmt: skip
        except DatabaseError as exc:
            release_broken_connections()
            self._claim_failed(planned, key, exc)
            self.planner.push(now + recheck, planned.name)
            return
        if result.won is None:
            self.planner.push(result.next_check or now + recheck, planned.name)
            return
        self.host.counters.add(won=1)
        self.host.start_run(
            result.won,
            planned,
            now,
            planned.definition.default_payload(),
            on_done=lambda end: self.schedule_at(end + interval, planned.name),
        )

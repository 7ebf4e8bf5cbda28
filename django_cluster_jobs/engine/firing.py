"""What one tick does: claim due occurrences in batches, window-claim delays, take pending runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError

from .. import signals
from ..conf import app_settings
from ..coordination import Claim, Won
from ..coordination.base import takes_lane
from ..coordination.policies import Gate
from ..models import Outcome, RunState
from ..schedules import occurrence_key
from . import stats
from .executor import release_broken_connections
from .handlers import merged_payload, safe_text
from .planner import Planned

if TYPE_CHECKING:
    from .node import Node

logger = logging.getLogger("django_cluster_jobs.engine.node")

#: An occurrence later than this when the loop reaches it is missed, not fired.
MISFIRE_GRACE = timedelta(seconds=5)

Pair = tuple[Planned, Claim]


def lease_ttl() -> timedelta:
    return timedelta(seconds=app_settings.LEASE_TTL)


def limited(planned: Planned) -> Gate | None:
    """The gate for taking a job's pending runs: its max_concurrency and queue limit, if any."""
    definition = planned.definition
    queue_limit = app_settings.QUEUE_LIMITS.get(definition.queue)
    if definition.placement != "cluster" or not (definition.max_concurrency or queue_limit):
        return None
    return Gate(definition.overlap, definition.max_concurrency, definition.queue, queue_limit)


def gate_of(planned: Planned) -> Gate | None:
    """The gate of jobs whose overlap the batch claim cannot decide alone; None for the rest.

    The batch claim handles "allow" without limits (nothing to decide) and "skip" with a limit
    of one (the lane's partial unique index decides); everything else is gated.
    """
    definition = planned.definition
    if definition.placement != "cluster":
        return None
    queue_limit = app_settings.QUEUE_LIMITS.get(definition.queue)
    limit = definition.max_concurrency or (None if definition.overlap == "allow" else 1)
    batch_decides = (definition.overlap == "skip" and limit == 1) or limit is None
    if batch_decides and not queue_limit:
        return None
    return Gate(definition.overlap, limit, definition.queue, queue_limit)


class Firing:
    """The claiming half of the node loop; mixed into Node."""

    def _collect(self: Node, now: datetime) -> tuple[list[Pair], list[tuple[Planned, datetime]]]:
        claims, windows = [], []
        for due, name in self.planner.pop_due(now):
            planned = self.planned.get(name)
            if planned is None:
                continue
            if planned.schedule.kind == "delay":
                windows.append((planned, due))
                continue
            if self._held_back(planned, due, now):
                continue
            self._collected[name] = max(due, self._collected.get(name, due))
            self._push_next(planned, max(due, now - MISFIRE_GRACE))
            if self._skip_reason(planned, due, now) is None:
                claims.append((planned, self._claim_for(planned, due)))
        return claims, windows

    def _held_back(self: Node, planned: Planned, due: datetime, now: datetime) -> bool:
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
            if definition.enabled:
                self._push_next(planned, max(due, paused_until - timedelta(microseconds=1)))
            return True
        began = self._live_since.get(name)
        if began is not None and due < began and gate_of(planned) is None and self._laned(planned):
            self._skip(planned, occurrence_key(due), stats.DEFERRED)
            self._deferred.setdefault(name, []).append(due)
            self._push_next(planned, max(due, now - MISFIRE_GRACE))
            return True
        return False

    def _released_claims(self: Node, now: datetime) -> list[Pair]:
        """Claims of the occurrences held back until this node's live run of their job ended."""
        claims = []
        while not self._released.empty():
            due, name = self._released.get()
            planned = self.planned.get(name)
            if planned is not None and self._skip_reason(planned, due, now) is None:
                claims.append((planned, self._claim_for(planned, due)))
        return claims

    @staticmethod
    def _laned(planned: Planned) -> bool:
        return takes_lane(planned.definition, Outcome.WON)

    def _claim_due(self: Node, claims: list[Pair], now: datetime) -> None:
        """Batch-claim what the database gate can decide alone; gate the rest one by one."""
        gated = [(p, c) for p, c in claims if gate_of(p) is not None]
        batched = [(p, c) for p, c in claims if gate_of(p) is None]
        if batched:
            self._claim_slots(batched, now)
        for planned, claim in self._fit_capacity(gated):
            self._claim_gated(planned, claim, now)

    def _push_next(self: Node, planned: Planned, after: datetime) -> None:
        """Plan the job's next occurrence after ``after`` (none past the end of the calendar)."""
        try:
            following = planned.schedule.next_after(after)
        except (OverflowError, ValueError):
            following = None
        if following is not None:
            self.planner.push(following, planned.name)

    def _skip_reason(self: Node, planned: Planned, due: datetime, now: datetime) -> str | None:
        """Skip an occurrence too late to claim: the leader settles it by the misfire policy."""
        if due < now - MISFIRE_GRACE:
            self._skip(planned, occurrence_key(due), stats.MISSED)
            return stats.MISSED
        return None

    def _skip(self: Node, planned: Planned, key: str, reason: str) -> None:
        self.counters.add(skipped=reason)
        logger.debug(
            "skip %s @ %s: %s",
            planned.name,
            key,
            reason,
            extra={**self.log_extra, "job": planned.name, "occurrence": key},
        )

    def _claim_for(
        self: Node,
        planned: Planned,
        due: datetime,
        outcome: str | None = None,
        key: str | None = None,
    ) -> Claim:
        definition = planned.definition
        slot = key is None and planned.schedule.slotted
        key = key or occurrence_key(due)
        if definition.placement == "every_node" and outcome is None:
            key, outcome = f"{key}@{self.node_id}", Outcome.EVERY_NODE
        return Claim(
            definition.pk,
            key,
            due,
            outcome or Outcome.WON,
            definition.priority,
            dict(definition.payload or {}),
            slot=slot,
            revision=definition.revision,
        )

    def _claim_slots(self: Node, claims: list[Pair], now: datetime) -> None:
        claims = self._fit_capacity(claims)
        by_key = {(c.job_id, c.key): (p, c) for p, c in claims}
        size = app_settings.CLAIM_BATCH_SIZE
        for start in range(0, len(claims), size):
            batch = [c for _, c in claims[start : start + size]]
            for won in self._claim_batch(batch, by_key, now):
                planned, claim = by_key[(won.job_id, won.key)]
                self._submit(won, planned, claim.scheduled_at, claim.payload)

    def _fit_capacity(self: Node, claims: list[Pair]) -> list[Pair]:
        """Keep what the executor can start now (every-node first); skip the rest with a reason."""
        reason, free = stats.NODE_BUSY, self.executor.free
        if self.stopping:
            reason, free = stats.DRAINING, 0
        claims = sorted(
            claims, key=lambda pc: (pc[1].outcome != Outcome.EVERY_NODE, -pc[1].priority)
        )
        for planned, claim in claims[free:]:
            self._skip(planned, claim.key, reason)
        return claims[:free]

    def _claim_batch(self: Node, batch: list[Claim], by_key: dict, now: datetime) -> list[Won]:
        lease_until = now + timedelta(seconds=app_settings.LEASE_TTL)
        try:
            won = self.coordinator.claim(batch, self.node_id, now, lease_until)
        except DatabaseError as exc:
            release_broken_connections()
            for claim in batch:
                self._claim_failed(by_key[(claim.job_id, claim.key)][0], claim.key, exc)
            return []
        won_keys = {(w.job_id, w.key) for w in won}
        lost = [by_key[(c.job_id, c.key)] for c in batch if (c.job_id, c.key) not in won_keys]
        self.counters.add(won=len(won))
        self._settle_losers(lost, now)
        return won

    def _settle_losers(self: Node, lost: list[Pair], now: datetime) -> None:
        """Count each claim the gate refused by its reason; record the ones a live run refused
        (overlap); the rest were claimed by another node."""
        if not lost:
            return
        gates = self.coordinator.gate_states({c.job_id for _, c in lost})
        for planned, claim in lost:
            gate = gates.get(claim.job_id)
            reason = gate.refusal(claim, now) if gate is not None else stats.DISABLED
            if reason == stats.OVERLAP:
                why = f"overlap: the previous run is still live ({gate.live_key})"
                self._record_skip(planned, claim, now, why, stats.OVERLAP)
            elif reason == stats.CHANGED:
                self._replan_after(planned, claim)
            elif reason is not None:
                self._skip(planned, claim.key, reason)
            else:
                self.counters.add(lost=1)
                self._skip(planned, claim.key, stats.CLAIMED_ELSEWHERE)

    def _replan_after(self: Node, planned: Planned, claim: Claim) -> None:
        """This node planned from a definition changed since: forget it collected the refused
        occurrence and re-plan at once, so the change's own first occurrences are claimed."""
        self._skip(planned, claim.key, stats.CHANGED)
        self._collected[planned.name] = min(
            self._collected.get(planned.name, claim.scheduled_at),
            claim.scheduled_at - timedelta(microseconds=1),
        )
        self.request_reload()

    def _record_skip(
        self: Node, planned: Planned, claim: Claim, now: datetime, reason: str, counter: str
    ) -> None:
        self._skip(planned, claim.key, counter)
        run = self.coordinator.record_skip(claim, self.node_id, now, reason)
        if run is not None:
            signals.send(
                signals.run_skipped,
                planned.name,
                run_id=run.pk,
                key=claim.key,
                node=self.node_id,
                attempt=0,
                reason=reason,
            )

    def _claim_gated(self: Node, planned: Planned, claim: Claim, now: datetime) -> None:
        try:
            result = self.coordinator.claim_gated(
                claim, gate_of(planned), self.node_id, self.clock.now, lease_ttl()
            )
        except DatabaseError as exc:
            release_broken_connections()
            self._claim_failed(planned, claim.key, exc)
            return
        if result.won is not None:
            self.counters.add(won=1)
            self._submit(result.won, planned, claim.scheduled_at, claim.payload)
        elif result.buffered:
            self._skip(planned, claim.key, stats.BUFFERED)
        elif result.skipped:
            counter = stats.OVERLAP
            if result.skipped.startswith("max_concurrency"):
                counter = stats.CONCURRENCY
            elif result.skipped.startswith("queue"):
                counter = stats.QUEUE_LIMIT
            self._record_skip(planned, claim, now, result.skipped, counter)
        else:
            self.counters.add(lost=1)
            self._skip(planned, claim.key, stats.CLAIMED_ELSEWHERE)

    def _claim_failed(self: Node, planned: Planned, key: str, exc: Exception) -> None:
        self._skip(planned, key, stats.CLAIM_FAILED)
        logger.warning(
            "claim failed, skipping %s @ %s (fail-closed): %s",
            planned.name,
            key,
            exc,
            extra={**self.log_extra, "job": planned.name, "occurrence": key},
        )

    def _claim_window(self: Node, planned: Planned, now: datetime) -> None:
        interval = planned.schedule.interval  # type: ignore[attr-defined]
        recheck = timedelta(seconds=app_settings.HEARTBEAT_INTERVAL)
        if self.stopping or not planned.definition.enabled or self.executor.free < 1:
            self.planner.push(now + min(interval, recheck), planned.name)
            return
        key = occurrence_key(now)
        lease_until = now + timedelta(seconds=app_settings.LEASE_TTL)
        try:
            result = self.coordinator.claim_window(
                planned.definition.pk, interval, key, self.node_id, now, lease_until, recheck
            )
        except DatabaseError as exc:
            release_broken_connections()
            self._claim_failed(planned, key, exc)
            self.planner.push(now + recheck, planned.name)
            return
        if result.won is None:
            self.planner.push(result.next_check or now + recheck, planned.name)
            return
        self.counters.add(won=1)
        self._submit(
            result.won,
            planned,
            now,
            dict(planned.definition.payload or {}),
            on_done=lambda end: self.schedule_at(end + interval, planned.name),
        )

    def _take_limited(
        self: Node, job_ids: dict[int, Planned], free: int, now: datetime, lease_until: datetime
    ) -> list[Won]:
        """Take pending runs of jobs with a concurrency or queue limit, one at a time, locked."""
        taken: list[Won] = []
        for pk, planned in job_ids.items():
            gate = limited(planned)
            while gate is not None and len(taken) < free:
                won = self.coordinator.claim_pending_gated(
                    self.node_id,
                    pk,
                    gate,
                    self.clock.now,
                    lease_ttl(),
                )
                if not won:
                    break
                taken += won
        return taken

    def _take_pending(self: Node, now: datetime) -> None:
        """Start pending runs (enqueued, retried, taken over) that are due, as capacity allows."""
        job_ids = {p.definition.pk: p for p in self.planned.values()}
        free = 0 if self.stopping else self.executor.free
        lease_until = now + timedelta(seconds=app_settings.LEASE_TTL)
        taken: list[Won] = []
        # A node that polls reads first, so an idle poll writes nothing (on SQLite it takes no
        # writer lock). A listening node looks only when notified or at a known due time, when
        # there is most likely something to take, so it takes first.
        listening = self.listener is not None and self.listener.healthy
        try:
            if listening and free > 0:
                next_due: datetime | None = now
            else:
                next_due = self.coordinator.next_pending_due(list(job_ids))
            if free > 0 and next_due is not None and next_due <= now:
                taken = self._take_limited(job_ids, free, now, lease_until)
                fast = [pk for pk, p in job_ids.items() if limited(p) is None]
                if free > len(taken) and fast:
                    taken += self.coordinator.claim_pending(
                        self.node_id, fast, free - len(taken), now, lease_until
                    )
                next_due = self.coordinator.next_pending_due(list(job_ids))
        except Exception as exc:  # a database error, or a stored run the take cannot rank
            release_broken_connections()
            logger.warning(
                "could not take pending runs (fail-closed): %s", exc, extra=self.log_extra,
                exc_info=not isinstance(exc, DatabaseError),
            )  # fmt: skip
            taken, next_due = [], None
        for won in taken:
            planned = job_ids[won.job_id]
            self._submit(won, planned, won.scheduled_at or now, won.payload or {})
        self._plan_pending(now, next_due)

    def _refuse_run(self: Node, won: Won, planned: Planned, error: str) -> None:
        """End a taken run that cannot start (its stored data is unusable) as failed, once."""
        logger.error("%s @ %s (run %s) cannot start: %s", planned.name, won.key, won.run_id,
                     error, extra={**self.log_extra, "job": planned.name})  # fmt: skip
        try:
            self.coordinator.finish(won, self.node_id, RunState.FAILED, self.clock.now(),
                                    error=safe_text(error))  # fmt: skip
        except DatabaseError:
            release_broken_connections()  # its lease expires; the leader releases it

    def _submit(
        self: Node,
        won: Won,
        planned: Planned,
        scheduled_at: datetime,
        payload: dict,
        on_done: Callable[[datetime], None] | None = None,
    ) -> None:
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
        try:
            merged = merged_payload(planned.definition.payload, payload)
        except TypeError as exc:
            self._refuse_run(won, planned, f"InvalidPayload: {exc}")
            return
        name = planned.name
        if self._laned(planned):
            self._live_since[name] = self.clock.now()

        def task() -> None:
            try:
                self.runner.run(won, planned, scheduled_at, merged, on_done)
            finally:
                self.task_done(name)

        if not self.executor.submit(task):  # capacity is checked before claiming
            logger.error(
                "executor full after claiming %s @ %s; running it on a spare thread",
                planned.name,
                won.key,
                extra=self.log_extra,
            )
            threading.Thread(target=task, daemon=True).start()

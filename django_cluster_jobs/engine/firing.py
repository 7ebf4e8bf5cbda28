"""What one tick does: claim due occurrences in batches, window-claim delays, take pending runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError

from ..conf import app_settings
from ..coordination import Claim, Won
from ..models import Outcome
from ..schedules import occurrence_key
from . import stats
from .executor import release_broken_connections
from .planner import Planned

if TYPE_CHECKING:
    from .node import Node

logger = logging.getLogger("django_cluster_jobs.engine.node")

#: An occurrence later than this when the loop reaches it is missed, not fired.
MISFIRE_GRACE = timedelta(seconds=5)

Pair = tuple[Planned, Claim]


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
            self._push_next(planned, max(due, now - MISFIRE_GRACE))
            if self._skip_reason(planned, due, now) is None:
                claims.append((planned, self._claim_for(planned, due)))
        return claims, windows

    def _push_next(self: Node, planned: Planned, after: datetime) -> None:
        following = planned.schedule.next_after(after)
        if following is not None:
            self.planner.push(following, planned.name)

    def _skip_reason(self: Node, planned: Planned, due: datetime, now: datetime) -> str | None:
        reason = None
        if not planned.definition.enabled:
            reason = stats.DISABLED
        elif due < now - MISFIRE_GRACE:
            reason = stats.MISSED
        if reason is not None:
            self._skip(planned, occurrence_key(due), reason)
        return reason

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
        for claim in batch:
            if (claim.job_id, claim.key) not in won_keys:
                self.counters.add(lost=1)
                self._skip(by_key[(claim.job_id, claim.key)][0], claim.key, stats.CLAIMED_ELSEWHERE)
        self.counters.add(won=len(won))
        return won

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

    def _take_pending(self: Node, now: datetime) -> None:
        """Start pending runs (enqueued, retried, taken over) that are due, as capacity allows."""
        job_ids = {p.definition.pk: p for p in self.planned.values()}
        free = 0 if self.stopping else self.executor.free
        lease_until = now + timedelta(seconds=app_settings.LEASE_TTL)
        try:
            taken = (
                self.coordinator.claim_pending(self.node_id, list(job_ids), free, now, lease_until)
                if free
                else []
            )
            next_due = self.coordinator.next_pending_due(list(job_ids))
        except DatabaseError as exc:
            release_broken_connections()
            logger.warning(
                "could not take pending runs (fail-closed): %s", exc, extra=self.log_extra
            )
            taken, next_due = [], None
        for won in taken:
            planned = job_ids[won.job_id]
            self._submit(won, planned, won.scheduled_at or now, won.payload or {})
        self._plan_pending(now, next_due)

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
        merged = {**(planned.definition.payload or {}), **payload}

        def task() -> None:
            self.runner.run(won, planned, scheduled_at, merged, on_done)

        if not self.executor.submit(task):  # capacity is checked before claiming
            logger.error(
                "executor full after claiming %s @ %s; running it on a spare thread",
                planned.name,
                won.key,
                extra=self.log_extra,
            )
            threading.Thread(target=task, daemon=True).start()

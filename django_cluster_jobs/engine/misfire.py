"""Misfire policies: what one leader's pass does with the occurrences of one job no node fired.

Pure decisions and the rows they write; ``catchup`` finds the occurrences, writes the rows through
the claim gate and records the pass. See ``catchup``'s docstring for the policies themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..coordination.base import takes_lane
from ..models import JobDefinition, JobRun, Misfire, Outcome, RunState
from ..schedules import occurrence_key
from .planner import Planned

#: Most "missed" rows written for one job in one pass (the most recent ones).
MISSED_ROWS_LIMIT = 1_000


@dataclass
class Plan:
    """What one pass does for one job: occurrences to run now, and missed ones with reasons."""

    planned: Planned
    runs: list[datetime] = field(default_factory=list)
    missed: list[tuple[datetime, str]] = field(default_factory=list)
    dropped: int = 0


def decide(
    planned: Planned, missing: list[datetime], now: datetime, queued: datetime | None = None
) -> Plan:
    """Apply the job's window and misfire policy to its missed occurrences (oldest first);
    ``queued`` is when its latest catch-up was written, if any."""
    definition = planned.definition
    window = definition.catch_up_window
    plan, candidates = Plan(planned), []
    for at in missing:
        if window is not None and at < now - window:
            plan.missed.append((at, f"older than the catch-up window ({window})"))
        elif queued is not None and at <= queued:
            plan.missed.append((at, f"due before the catch-up queued at {occurrence_key(queued)}"))
        else:
            candidates.append(at)
    limit = {Misfire.FIRE_ONCE: 1, Misfire.RUN_ALL: definition.catch_up_limit}.get(
        definition.misfire, 0
    )
    split = max(0, len(candidates) - limit)
    plan.runs = candidates[split:]
    if split:
        reason = not_run(definition, plan.runs)
        plan.missed = sorted(plan.missed + [(at, reason) for at in candidates[:split]])
    plan.dropped = max(0, len(plan.missed) - MISSED_ROWS_LIMIT)
    plan.missed = plan.missed[plan.dropped :]
    return plan


def not_run(definition: JobDefinition, runs: list[datetime]) -> str:
    """Why the occurrences the policy leaves out do not run."""
    if definition.misfire == Misfire.FIRE_ONCE and runs:
        return f"fire_once runs only the latest missed occurrence ({occurrence_key(runs[-1])})"
    if definition.misfire == Misfire.RUN_ALL:
        return f"run_all runs only the latest {definition.catch_up_limit} missed occurrence(s)"
    return "the misfire policy is skip"


def rows_of(plan: Plan, now: datetime, leader: str) -> list[JobRun]:
    """The rows of ``plan``, in time order: missed ones and pending catch-up runs."""
    definition = plan.planned.definition
    lane = None
    if definition.misfire == Misfire.FIRE_ONCE and takes_lane(definition, Outcome.CATCH_UP):
        lane = definition.pk
    rows = [
        missed_row(
            definition, at, now, f"no node fired it in time; {why}", node=leader, finished_at=now
        )
        for at, why in plan.missed
    ]
    for at in plan.runs:
        reason = f"catch-up ({definition.misfire}): no node fired it in time"
        rows.append(missed_row(definition, at, now, reason, state=RunState.PENDING, lane=lane))
    return sorted(rows, key=lambda row: row.scheduled_at)


def missed_row(
    definition: JobDefinition, at: datetime, now: datetime, reason: str, **fields: Any
) -> JobRun:
    """A missed row, or with ``state=RunState.PENDING`` a catch-up run due now."""
    pending = fields.get("state") == RunState.PENDING
    fields.setdefault("state", RunState.MISSED)
    return JobRun(
        job_id=definition.pk,
        key=occurrence_key(at),
        scheduled_at=at,
        due_at=now if pending else at,
        outcome=Outcome.CATCH_UP if pending else Outcome.MISSED,
        created_at=now,
        reason=reason[:200],
        payload=dict(definition.payload or {}),
        priority=definition.priority,
        **fields,
    )


def overlapped(row: JobRun, leader: str) -> JobRun:
    """Turn a catch-up run refused by a live run of its job into a skipped row."""
    row.state, row.lane, row.node, row.finished_at = RunState.SKIPPED, None, leader, row.created_at
    row.reason = "catch-up skipped: a run of this job is still pending or running (overlap skip)"
    return row

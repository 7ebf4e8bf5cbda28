"""Misfire policies: what becomes of the occurrences of one job that no node claimed in time.

Pure decisions over plain values, so the ledger (which writes the rows), the leader's catch-up and
the protocol model in the tests all decide alike. ``decide`` receives the job's unclaimed
occurrences in the span being settled, oldest first, and returns which of them run now (pending
catch-up runs) and which are recorded missed, each with its reason:

- ``catch_up_window`` (Kubernetes' ``startingDeadlineSeconds``): an occurrence older than
  ``now - catch_up_window`` never runs; ``None`` sets no bound.
- ``fire_once`` (default): the most recent occurrence that may still run becomes one catch-up run,
  unless a catch-up run of the job is still pending or running (it makes up for these too).
- ``skip``: none runs.
- ``run_all``: the most recent ``catch_up_limit`` that may still run become catch-up runs.

At most ``MISSED_ROWS_LIMIT`` missed occurrences per job and pass are returned, the most recent;
``Plan.dropped`` counts the rest, which are reported (never silently).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..choices import Misfire
from ..schedules import occurrence_key

#: Most "missed" rows written for one job in one pass (the most recent ones).
MISSED_ROWS_LIMIT = 1_000


@dataclass(frozen=True)
class Policy:
    """What ``decide`` needs of a job definition."""

    misfire: str = Misfire.FIRE_ONCE
    catch_up_window: timedelta | None = None
    catch_up_limit: int = 10

    @classmethod
    def of(cls, definition: object) -> Policy:
        """Read the policy fields of a JobDefinition (or anything with the same attributes)."""
        return cls(
            getattr(definition, "misfire", Misfire.FIRE_ONCE),
            getattr(definition, "catch_up_window", None),
            max(1, int(getattr(definition, "catch_up_limit", 10) or 1)),
        )


@dataclass
class Plan:
    """What settling one job decided: occurrences to run now, and missed ones with reasons."""

    runs: list[datetime] = field(default_factory=list)
    missed: list[tuple[datetime, str]] = field(default_factory=list)
    dropped: int = 0


def decide(
    policy: Policy,
    missing: list[datetime],
    now: datetime,
    *,
    catching_up: str | None = None,
) -> Plan:
    """Apply the window and the misfire policy to a job's unclaimed occurrences (oldest first);
    ``catching_up`` is the key of a catch-up run of the job still pending or running."""
    window = policy.catch_up_window
    plan, candidates = Plan(), []
    for at in missing:
        if window is not None and at < now - window:
            plan.missed.append((at, f"older than the catch-up window ({window})"))
        else:
            candidates.append(at)
    limit, why = _limit(policy, candidates, catching_up)
    split = max(0, len(candidates) - limit)
    plan.runs = candidates[split:]
    plan.missed = sorted(plan.missed + [(at, why) for at in candidates[:split]])
    plan.dropped = max(0, len(plan.missed) - MISSED_ROWS_LIMIT)
    plan.missed = plan.missed[plan.dropped :]
    return plan


def _limit(policy: Policy, candidates: list[datetime], catching_up: str | None) -> tuple[int, str]:
    """How many of the candidates run, and why the others do not."""
    if policy.misfire == Misfire.RUN_ALL:
        limit = policy.catch_up_limit
        return limit, f"run_all runs only the latest {limit} missed occurrence(s)"
    if policy.misfire != Misfire.FIRE_ONCE or not candidates:
        return 0, "the misfire policy is skip"
    if catching_up is not None:
        return 0, f"fire_once: the catch-up run {catching_up} is already queued"
    return 1, f"fire_once runs only the latest missed occurrence ({occurrence_key(candidates[-1])})"

"""Overlap and concurrency policies: which claims hold a job's lane, and which must be gated.

``skip`` (the default) never lets two runs of a job live at once cluster-wide: its scheduled runs
take the job's lane, a unique index over the lane of live runs (``JobRun.live_lane``), so the
batch claim itself refuses an overlapping one. Every other limit (``buffer_one``,
``cancel_other``, ``max_concurrency`` above one, a queue limit) needs the gated claim, which
decides under per-job and per-queue locks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..choices import Outcome, Overlap, Placement
from ..conf import app_settings


@dataclass(frozen=True)
class Gate:
    """A job's overlap policy and concurrency limit, as the gated claim applies them."""

    overlap: str
    limit: int | None
    queue: str = ""
    queue_limit: int | None = None


#: Outcomes of the runs that take a no-overlap job's lane; mirrored by sql.LANED.
LANED_OUTCOMES = (Outcome.WON, Outcome.CATCH_UP, Outcome.EXTERNAL)


def takes_lane(definition: Any, outcome: str) -> bool:
    """True when a claimed run holds its job's lane (no overlap); mirrors sql.LANED."""
    return (
        definition.overlap == Overlap.SKIP
        and (definition.max_concurrency or 1) <= 1
        and definition.placement == Placement.CLUSTER
        and outcome in LANED_OUTCOMES
    )


def gate_of(definition: Any) -> Gate | None:
    """The gate of jobs whose overlap the batch claim cannot decide alone; None for the rest.

    The batch claim handles "allow" without limits (nothing to decide) and "skip" with a limit
    of one (the lane's unique index decides); everything else is gated.
    """
    if definition.placement != Placement.CLUSTER:
        return None
    queue_limit = app_settings.QUEUE_LIMITS.get(definition.queue)
    limit = definition.max_concurrency or (None if definition.overlap == Overlap.ALLOW else 1)
    batch_decides = (definition.overlap == Overlap.SKIP and limit == 1) or limit is None
    if batch_decides and not queue_limit:
        return None
    return Gate(definition.overlap, limit, definition.queue, queue_limit)


def limited(definition: Any) -> Gate | None:
    """The gate for taking a job's pending runs: its max_concurrency and queue limit, if any."""
    queue_limit = app_settings.QUEUE_LIMITS.get(definition.queue)
    if definition.placement != Placement.CLUSTER or not (definition.max_concurrency or queue_limit):
        return None
    return Gate(definition.overlap, definition.max_concurrency, definition.queue, queue_limit)

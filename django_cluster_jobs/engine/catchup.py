"""The leader's catch-up: settle what no node claimed in time, from each job's mark.

A node claims an occurrence only while it is at most ``MISFIRE_GRACE`` late, and plans each job
from the later of the job's ``settled_through`` mark and its own start. So once an occurrence is
older than :func:`horizon`, no node will still claim it, and the leader settles it: at each chore
pass, in the fenced chores transaction, it reads the definitions that have an occurrence to
settle by the horizon (locked), settles (mark, horizon] by the job's misfire policy through the
claim gate and moves the mark to the horizon (see :mod:`django_cluster_jobs.ledger.settle`).

Each definition stores the first occurrence after its mark that may need settling
(``next_to_settle``, indexed; every move of the mark computes it again), so a pass reads only the
jobs whose next occurrence the horizon has reached: it costs O(those jobs + new occurrences),
whatever the number of jobs that have nothing to settle. Their marks stay behind, which is safe
(claims are refused at or before the mark, never after it) until a pass of everything moves
them: the first pass of a new leader, and the one before each purge (which deletes only rows
at or before their job's mark). Whichever node leads after an outage finds the gap at the mark,
whatever rows remain.

Each pass that settles anything adds one ``caught_up`` cluster event; ``run_missed`` and
``run_skipped`` are sent once the pass commits, for the rows it wrote itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Collection
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Max, Min, Q

from .. import signals
from ..conf import app_settings
from ..ledger.settle import SCAN_LIMIT, Settled, advance, settle
from ..models import (
    ClusterEvent,
    ClusterEventKind,
    JobDefinition,
    NodeStatus,
    RunState,
    WorkerNode,
)
from ..policies.misfire import MISSED_ROWS_LIMIT
from ..schedules import occurrence_key
from .claimer import MISFIRE_GRACE

logger = logging.getLogger(__name__)

#: Longest detail of the cluster event that sums up one pass.
EVENT_DETAIL_LIMIT = 4_000


def horizon(alias: str, now: datetime, leader: str) -> datetime:
    """Return the latest instant no node will still claim an occurrence at or before.

    ``now - MISFIRE_GRACE - HEARTBEAT_INTERVAL``, but never later than the other live nodes'
    latest heartbeat minus the grace (a leader whose clock runs ahead never settles their
    future); or the start of the earliest live node when that is later, since a node only fires
    what falls after its own start: a cluster back from an outage is settled in one pass.
    """
    settled = now - MISFIRE_GRACE - timedelta(seconds=app_settings.HEARTBEAT_INTERVAL)
    live = WorkerNode.objects.using(alias).filter(
        status__in=(NodeStatus.ACTIVE, NodeStatus.DRAINING)
    )
    others = live.exclude(node_id=leader).aggregate(beat=Max("last_heartbeat"))["beat"]
    if others is not None:
        settled = min(settled, others - MISFIRE_GRACE)
    first_start = live.aggregate(first=Min("started_at"))["first"]
    return settled if first_start is None else max(settled, min(first_start, now))


def catch_up(
    alias: str,
    jobs: Collection[str],
    leader: str,
    now: datetime,
    fence: int | None = None,
    *,
    everything: bool = True,
) -> int:
    """Settle every job whose callable is in ``jobs`` up to the horizon; return rows written.

    With ``everything`` False only the jobs that have an occurrence to settle are read (their
    ``next_to_settle`` is at or before the horizon, or unknown): the others' marks stay where
    they are until a pass of everything moves them. Call inside the leader's fenced chores
    transaction (it opens its own otherwise).
    """
    with transaction.atomic(using=alias):
        until = horizon(alias, now, leader)
        definitions = _definitions(alias, until, everything)
        # A job whose code no node has (orphaned) can run nothing: its occurrences are not due.
        orphaned = [d for d in definitions if d.callable_name not in jobs]
        runnable = [d for d in definitions if d.callable_name in jobs]
        settled = settle(alias, runnable, until, now, decider=leader)
        advance(alias, orphaned, until)
        _record(alias, settled, now, leader, fence)
        _announce(alias, settled, leader)
    _warn(settled, leader)
    return sum(len(s.written) for s in settled)


def _definitions(alias: str, until: datetime, everything: bool) -> list[JobDefinition]:
    """The definitions not yet settled through ``until`` (with ``everything`` False, only those
    with an occurrence to settle by then), locked against changes."""
    rows = JobDefinition.objects.using(alias).filter(settled_through__lt=until)
    if not everything:
        reached = Q(next_to_settle__isnull=True) | Q(next_to_settle__lte=until)
        rows = rows.filter(reached)
    features = transaction.get_connection(alias).features
    if features.has_select_for_update:
        rows = rows.select_for_update(no_key=features.has_select_for_no_key_update)
    return list(rows.order_by("pk"))


def _record(
    alias: str, settled: list[Settled], now: datetime, leader: str, fence: int | None
) -> None:
    """Log what each job's settlement did and add one cluster event for the whole pass."""
    lines = []
    for s in settled:
        counts = Counter(row.state for row in s.written)
        queued, missed, skipped = (
            counts[state] for state in (RunState.PENDING, RunState.MISSED, RunState.SKIPPED)
        )
        if not (queued or missed or skipped or s.plan.dropped):
            continue
        name = s.definition.name
        line = f"{name}: {queued} catch-up run(s) queued, {missed} recorded missed"
        line += f", {skipped} skipped"
        logger.info("%s", line, extra={"node": leader, "job": name})
        if s.plan.dropped:
            line += f", {s.plan.dropped} more missed and not recorded"
        lines.append(line)
    if lines:
        ClusterEvent.objects.using(alias).create(
            at=now,
            kind=ClusterEventKind.CAUGHT_UP,
            node=leader,
            fence=fence,
            detail="; ".join(lines)[:EVENT_DETAIL_LIMIT],
        )


def _announce(alias: str, settled: list[Settled], leader: str) -> None:
    """Send ``run_missed`` and ``run_skipped`` for the rows this pass wrote, once committed."""
    rows = [
        (s.definition.name, row)
        for s in settled
        for row in s.written
        if row.state in (RunState.MISSED, RunState.SKIPPED)
    ]
    if not rows:
        return

    def send() -> None:
        for name, row in rows:
            signal = signals.run_missed if row.state == RunState.MISSED else signals.run_skipped
            signals.send(
                signal, name, run_id=row.pk, key=row.key, node=leader, attempt=0, reason=row.reason
            )

    transaction.on_commit(send, using=alias)


def _warn(settled: list[Settled], leader: str) -> None:
    for s in settled:
        name, extra = s.definition.name, {"node": leader, "job": s.definition.name}
        if s.plan.dropped:
            logger.warning(
                "%s: %d more missed occurrence(s) not recorded (at most %d rows per pass)",
                name, s.plan.dropped, MISSED_ROWS_LIMIT, extra=extra,
            )  # fmt: skip
        if s.truncated_at is not None:
            logger.warning(
                "%s: more than %d occurrences to settle; those before %s were settled missed "
                "without a row each", name, SCAN_LIMIT, occurrence_key(s.truncated_at),
                extra=extra,
            )  # fmt: skip

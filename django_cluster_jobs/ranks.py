"""The stored rank of a pending run, so that an index serves the take's order, aging included.

A due run ranks ``priority + seconds overdue / PRIORITY_AGING``, highest first. At any instant
``now`` that is the same order as ``due_at - priority * PRIORITY_AGING``, lowest first, which
does not depend on ``now``: it is stored with the run (``JobRun.pending_rank``) whenever the
run becomes pending, and a partial index on (pending_rank, due_at, id) serves the take.

The rank is a whole number of microseconds since 1970 (both terms are exact at the
microsecond, as due times are), the priority clamped to PRIORITY_MIN…PRIORITY_MAX as the take
ranks it. Any stored due time (years 1 to 9999) and any aging up to RANK_AGING_MAX fit in a
64-bit integer with room to spare; a longer aging ranks as no aging (strict priority order),
which is what it means for any two due times a run can have.

The rank depends on PRIORITY_AGING, so the aging it was computed with is kept in the
``pending_aging`` counter; a process whose setting differs re-ranks the pending runs once
before it takes (:func:`ensure_ranked`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import BigIntegerField, F, Value
from django.db.models.functions import Cast, Greatest, Least

from .bounds import PRIORITY_MAX, PRIORITY_MIN
from .conf import app_settings

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
#: The longest aging a rank is computed with (about 2,500 years); PRIORITY_MAX of it plus any
#: due time stays within a signed 64-bit integer.
RANK_AGING_MAX = timedelta(microseconds=8 * 10**16)
#: The counter that holds the aging (in microseconds) the stored ranks were computed with.
AGING_COUNTER = "pending_aging"
#: Rows re-ranked per statement when the aging changed.
RERANK_BATCH = 1000

#: (alias) -> the aging in microseconds this process last found the stored ranks computed with.
_RANKED: dict[str, int] = {}


def aging_step() -> timedelta | None:
    """Return the wait worth one priority point, or None when aging is off."""
    seconds = app_settings.PRIORITY_AGING
    if not seconds or seconds <= 0:
        return None
    step = timedelta(seconds=seconds)
    return step if step <= RANK_AGING_MAX else None


def aging_us() -> int:
    """The aging the rank uses, in whole microseconds (0 when aging is off)."""
    step = aging_step()
    return 0 if step is None else step // MICROSECOND


def bounded(priority: int) -> int:
    """The priority a run ranks with: its own, within PRIORITY_MIN…PRIORITY_MAX."""
    return max(PRIORITY_MIN, min(PRIORITY_MAX, priority))


def rank_of(due_at: datetime, priority: int, aging: int | None = None) -> int:
    """The stored rank of a run pending with ``due_at`` and ``priority``."""
    aging = aging_us() if aging is None else aging
    if due_at.tzinfo is None:  # a naive time, as USE_TZ = False stores them: read as UTC
        due_at = due_at.replace(tzinfo=UTC)
    return (due_at - EPOCH) // MICROSECOND - bounded(priority) * aging


def rank_expression(due_at: datetime) -> Any:
    """The rank of rows made pending with ``due_at``, each with its own priority (for
    ``update()``)."""
    priority = Least(Greatest(F("priority"), Value(PRIORITY_MIN)), Value(PRIORITY_MAX))
    clamped = Cast(priority, BigIntegerField())  # a 32-bit product would overflow
    due = Value(rank_of(due_at, 0, 0), output_field=BigIntegerField())
    aging = Value(aging_us(), output_field=BigIntegerField())
    return due - clamped * aging


def ensure_ranked(alias: str) -> None:
    """Re-rank every pending run when the stored ranks were computed with another aging."""
    current = aging_us()
    if _RANKED.get(alias) == current:
        return
    from .models import Counter

    with transaction.atomic(using=alias):
        counters = Counter.objects.using(alias).filter(name=AGING_COUNTER)
        if counters.values_list("value", flat=True).first() != current:
            rerank(alias, current)
            Counter.objects.using(alias).update_or_create(
                name=AGING_COUNTER, defaults={"value": current}
            )
    _RANKED[alias] = current


def rerank(alias: str, aging: int, model: Any = None) -> int:
    """Store the rank of every pending run under ``aging``; return how many were ranked.

    ``model`` is the JobRun model to use (a migration's historical one); the default is ours.
    """
    if model is None:
        from .models import JobRun as model
    pending = model.objects.using(alias).filter(state="pending").order_by("pk")
    rows = list(pending.values_list("pk", "due_at", "priority"))
    for start in range(0, len(rows), RERANK_BATCH):
        batch = [
            model(pk=pk, pending_rank=rank_of(due, priority, aging))
            for pk, due, priority in rows[start : start + RERANK_BATCH]
        ]
        model.objects.using(alias).bulk_update(batch, ["pending_rank"])
    return len(rows)

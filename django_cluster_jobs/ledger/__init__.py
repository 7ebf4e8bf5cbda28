"""The portable ledger layer: fenced writes on runs, gates, the leader's chores, leases, the
settled-through mark, written once over the ORM on top of a vendor (coordination).

:func:`get_ledger` returns the :class:`Ledger` of the configured database: its ``vendor`` (the
hot statements) and the parts written once (``runs``, ``gates``, ``chores``). Engine parts take
the part they need.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from django.db.models import Min

from ..coordination import Vendor, get_vendor
from ..models import DEFINITIONS, Counter, JobRun, RunState
from ..stored import UNREADABLE, tolerant
from .chores import Chores
from .gates import Gates
from .runs import Runs

#: More job ids than this make the pending check ask first whether any run is pending at all.
MANY_JOBS = 300


class Ledger:
    """The ledger of one database: a vendor and the portable parts that write through it."""

    def __init__(self, vendor: Vendor) -> None:
        self.vendor = vendor
        self.alias = vendor.alias
        self.runs = Runs(vendor)
        self.gates = Gates(vendor, self.runs)
        self.chores = Chores(vendor, self.runs)

    def next_pending_due(self, job_ids: Collection[int]) -> datetime | None:
        """Return when the earliest pending run of ``job_ids`` is due, or None.

        Many jobs make a long statement: it is sent only when some run is pending at all, which
        a short one (served by the pending index) tells first."""
        pending = JobRun.objects.using(self.alias).filter(state=RunState.PENDING)
        if len(job_ids) > MANY_JOBS and not pending.exists():
            return None
        pending = pending.filter(job_id__in=job_ids)
        try:
            return pending.aggregate(due=Min("due_at"))["due"]
        except UNREADABLE:  # a due time no converter reads: the earliest of those that read
            dues = tolerant(pending.order_by("due_at").values_list("pk", "due_at"))
            return next((due for _, due in dues[:MANY_JOBS] if isinstance(due, datetime)), None)

    def definitions_version(self) -> int | None:
        """Return the definitions counter (models.Counter), which every change to a job
        definition moves; heartbeats read it in their own statement."""
        counters = Counter.objects.using(self.alias).filter(name=DEFINITIONS)
        return counters.values_list("value", flat=True).first()


def get_ledger(alias: str | None = None, kind: str | None = None) -> Ledger:
    """Return the ledger on the ledger database, through the vendor COORDINATION picks."""
    return Ledger(get_vendor(alias, kind))

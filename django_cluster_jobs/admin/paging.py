"""Pages of the ledger's long lists that never count the whole ledger.

Django's paginator counts every row a list matches, once per page view: a full ``COUNT(*)`` of
millions of runs. :class:`LedgerPaginator` asks the database for its estimate of an unfiltered
table instead (PostgreSQL's planner statistics) and counts a filtered list only up to
:attr:`~LedgerPaginator.cap` rows, so a page costs the same on a ledger of any size. The page
says which figure it shows (``admin/cluster_jobs/pagination.html``).
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

from ..status import estimated_rows


class LedgerPaginator(Paginator):
    """Count up to ``cap`` matching rows; an unfiltered list takes the database's estimate."""

    #: Most rows a filtered list counts; beyond them its pages end at ``cap`` rows.
    cap = 10_000

    #: How the count was made: "exact", "estimate" (of the whole table) or "capped".
    counted = "exact"

    @cached_property
    def count(self) -> int:
        rows: QuerySet = self.object_list  # type: ignore[assignment]  # the admin's queryset
        if not rows.query.where:
            estimate = estimated_rows(rows.db, rows.model)
            if estimate is not None and estimate > self.cap:
                self.counted = "estimate"
                return estimate
        found = rows.order_by()[: self.cap + 1].count()
        if found > self.cap:
            self.counted = "capped"
            return self.cap
        return found

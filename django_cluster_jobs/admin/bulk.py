"""Bulk actions on runs: replay every dead letter, cancel every pending run, of a selection.

The selection is what the runs changelist's action acts on: the runs ticked, or, with "select
all", every run the current filter and search match, not only the page shown. Each action first
shows a page that states how many runs it will change and under which filter; confirming posts
the same action again, and only then are the runs changed. The runs are read in chunks of
primary keys (never all at once), and each chunk goes through the service functions a single
run's action uses, which re-check each run's state as they write: a run that changed state since
the confirmation (a node took a pending run, someone replayed a dead letter) is left as it is.
Each changed run gets its admin log entry and its timeline event.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.contrib import messages
from django.contrib.admin import action
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import Exists, OuterRef, QuerySet
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import services
from ..conf import ledger
from ..exceptions import ImproperlyDeclared
from ..models import JobRun, RunState
from ..permissions import ADMIN, actor
from .base import OperatorActionsMixin

logger = logging.getLogger(__name__)

#: How many runs one chunk reads and changes.
CHUNK = 500
#: How many refused replays the report names (the rest are counted).
NAMED_REFUSALS = 5
#: The POST field that carries the count the operator confirmed.
CONFIRMED = "confirmed"


def chunks(queryset: QuerySet, size: int | None = None) -> Iterator[list[int]]:
    """Yield the primary keys of ``queryset`` in ascending chunks of ``size`` (:data:`CHUNK`),
    each chunk read when it is needed (keyset pagination: no OFFSET, no list of every key)."""
    size = size or CHUNK
    ids = queryset.order_by("pk").values_list("pk", flat=True)
    chunk = list(ids[:size])
    while chunk:
        yield chunk
        chunk = list(ids.filter(pk__gt=chunk[-1])[:size])


def dead_letters(queryset: QuerySet) -> QuerySet:
    """The dead-lettered runs of ``queryset`` that were not replayed yet."""
    replays = JobRun.objects.filter(origin=OuterRef("pk"))
    return queryset.filter(state=RunState.DEAD).filter(~Exists(replays))


def pending(queryset: QuerySet) -> QuerySet:
    return queryset.filter(state=RunState.PENDING)


def describe_filter(changelist) -> list[tuple[str, str]]:
    """(title, value) of each filter the changelist applies, its search and its date."""
    found = []
    for spec in changelist.filter_specs:
        if spec.used_parameters:
            chosen = [c["display"] for c in spec.choices(changelist) if c["selected"]]
            found.append((str(spec.title), ", ".join(str(c) for c in chosen)))
    if changelist.query:
        found.append((_("search"), changelist.query))
    hierarchy = changelist.date_hierarchy
    dates = [v for k, v in changelist.params.items() if hierarchy and k.startswith(hierarchy)]
    if dates:
        found.append((_("date"), "-".join(str(d) for d in dates)))
    return found


class BulkRunActionsMixin(OperatorActionsMixin):
    """Replay the dead letters and cancel the pending runs of a selection, confirmed first."""

    @action(description=gettext_lazy("Replay dead letters of the selection…"),
            permissions=["trigger"])  # fmt: skip
    def replay_dead_letters(self, request, queryset):
        matched = dead_letters(queryset)
        if "apply" not in request.POST:
            return self._confirm(request, queryset, matched, "replay_dead_letters")
        by, replayed, refused = actor(request, ADMIN), 0, []
        for chunk in chunks(matched):
            for pk in chunk:
                try:
                    fresh = services.replay_dead_letter(pk, by=by)
                except ImproperlyDeclared as exc:  # this run only: the others go on
                    refused.append(str(exc))
                    continue
                if fresh is not None:
                    self.log_change(request, fresh.origin, f"Replayed as run {fresh.pk}.")
                    replayed += 1
        self._log_bulk(request, "replayed", replayed)
        text = ngettext(
            "%(n)d dead letter replayed as a fresh pending run.",
            "%(n)d dead letters replayed as fresh pending runs.",
            replayed,
        ) % {"n": replayed}
        self._report_bulk(request, text, replayed)
        self._report_refused(request, refused)
        return None

    @action(description=gettext_lazy("Cancel pending runs of the selection…"),
            permissions=["manage"])  # fmt: skip
    def cancel_pending_runs(self, request, queryset):
        matched = pending(queryset)
        if "apply" not in request.POST:
            return self._confirm(request, queryset, matched, "cancel_pending_runs")
        by, cancelled = actor(request, ADMIN), 0
        for chunk in chunks(matched):
            ids = services.cancel_pending(chunk, by=by)
            runs = ledger(JobRun).select_related("job").filter(pk__in=ids)
            self.log_changes(request, runs, "Cancelled before it started.")
            cancelled += len(ids)
        self._log_bulk(request, "cancelled", cancelled)
        text = ngettext(
            "%(n)d pending run cancelled.", "%(n)d pending runs cancelled.", cancelled
        ) % {"n": cancelled}
        self._report_bulk(request, text, cancelled)
        return None

    def log_changes(self, request, objs, message: str) -> None:
        """One admin log entry per object, written in one statement."""
        LogEntry.objects.log_actions(
            user_id=request.user.pk, queryset=list(objs), action_flag=CHANGE,
            change_message=message,
        )  # fmt: skip

    def _confirm(self, request, queryset, matched, name: str):
        across = request.POST.get("select_across") == "1"
        description = getattr(getattr(self, name), "short_description", name)
        context = {
            **self.admin_site.each_context(request),
            "title": description,
            "opts": self.model._meta,
            "action": name,
            "action_text": description,
            "count": matched.count(),
            "across": across,
            "filters": describe_filter(self.get_changelist_instance(request)) if across else [],
            "selected": request.POST.getlist("_selected_action"),
        }
        return TemplateResponse(request, "admin/cluster_jobs/bulk_confirm.html", context)

    def _log_bulk(self, request, act: str, n: int) -> None:
        logger.info("bulk action: %d runs %s by %s (query %r)", n, act,
                    actor(request, ADMIN), request.GET.urlencode(),
                    extra={"actor": actor(request, ADMIN)})  # fmt: skip

    def _report_bulk(self, request, text: str, n: int) -> None:
        confirmed = request.POST.get(CONFIRMED, "")
        if confirmed.isdigit() and int(confirmed) != n:
            text += " " + _(
                "%(confirmed)s matched when you confirmed: the others changed state since "
                "(a node took them, or someone else acted on them) and were left as they are."
            ) % {"confirmed": confirmed}
        self.message_user(request, text, messages.SUCCESS if n else messages.WARNING)

    def _report_refused(self, request, refused: list[str]) -> None:
        if not refused:
            return
        named = "; ".join(refused[:NAMED_REFUSALS])
        more = len(refused) - NAMED_REFUSALS
        text = ngettext("%(n)d dead letter not replayed: %(why)s",
                        "%(n)d dead letters not replayed: %(why)s", len(refused))  # fmt: skip
        text %= {"n": len(refused), "why": named}
        if more > 0:
            text += " " + _("(and %(more)d more)") % {"more": more}
        self.message_user(request, text, messages.WARNING)

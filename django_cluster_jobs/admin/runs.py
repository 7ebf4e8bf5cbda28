"""Runs in the console: the read-only ledger with its timeline, plus cancel and replay (of the
runs ticked, or in bulk of every run a filter matches: :mod:`.bulk`)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import services
from ..columns import holds_a_name, holds_an_id
from ..conf import app_settings, ledger
from ..exceptions import ImproperlyDeclared
from ..models import (
    LIVE_STATES,
    JobDefinition,
    JobRun,
    RunEvent,
    RunLog,
    RunState,
    WorkerNode,
)
from ..permissions import ADMIN, actor, can_view
from ..stored import tolerant
from ..wording import interval_text
from ..workflows import instance_of
from .base import LedgerDatabaseMixin, ReadOnlyMixin
from .bulk import BulkRunActionsMixin
from .overview import instance_view
from .paging import LedgerPaginator
from .text import as_json, pre, time_column

#: How much of an error's first line the runs list shows.
ERROR_SUMMARY = 50


class CheckedFilter(admin.SimpleListFilter):
    """A filter whose value from the query string is checked as the list is built: a value
    no row can hold is Django's invalid lookup (the list again, with ``?e=1``), before any
    query runs (a facet count runs later, while the page renders)."""

    def __init__(self, request, params, model, model_admin) -> None:
        super().__init__(request, params, model, model_admin)
        value = self.value()
        if value and not self.accepts(value):
            raise IncorrectLookupParameters(f"{self.parameter_name}={value[:50]!r} names nothing")

    def accepts(self, value: str) -> bool:
        return holds_a_name(value)


class LedgerChoicesFilter(CheckedFilter):
    """A filter whose choices come from a small ledger table (never from the runs themselves)."""

    field = ""

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class JobFilter(LedgerChoicesFilter):
    title, parameter_name, field = gettext_lazy("job"), "job", "job_id"

    def accepts(self, value: str) -> bool:
        return holds_an_id(value)

    def lookups(self, request, model_admin):
        return ledger(JobDefinition).values_list("pk", "name")


class QueueFilter(CheckedFilter):
    """Runs of the jobs of one queue: the jobs are looked up first, so an index on the runs
    serves the list (the queue is the job's, not the run's)."""

    title, parameter_name = gettext_lazy("queue"), "queue"

    def lookups(self, request, model_admin):
        queues = ledger(JobDefinition).order_by("queue").values_list("queue", flat=True)
        return [(queue, queue) for queue in queues.distinct()]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        jobs = ledger(JobDefinition).filter(queue=self.value()).values_list("pk", flat=True)
        return queryset.filter(job_id__in=list(jobs))


class ScheduledFilter(admin.SimpleListFilter):
    """Runs scheduled within a recent span: what a date drill-down would give, without the
    scan of the whole ledger Django's date hierarchy makes to list its years and months."""

    title, parameter_name = gettext_lazy("scheduled"), "scheduled"
    SPANS = {
        "hour": (gettext_lazy("Last hour"), timedelta(hours=1)),
        "day": (gettext_lazy("Last 24 hours"), timedelta(days=1)),
        "week": (gettext_lazy("Last 7 days"), timedelta(days=7)),
        "month": (gettext_lazy("Last 30 days"), timedelta(days=30)),
    }

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _span) in self.SPANS.items()]

    def queryset(self, request, queryset):
        span = self.SPANS.get(self.value() or "")
        if span is None:
            return queryset
        return queryset.filter(scheduled_at__gte=timezone.now() - span[1])


class NodeFilter(LedgerChoicesFilter):
    title, parameter_name, field = gettext_lazy("node"), "node", "node"

    def lookups(self, request, model_admin):
        nodes = ledger(WorkerNode).values_list("node_id", flat=True)
        return [(node, node) for node in nodes]


class RunPartInline(ReadOnlyMixin, admin.TabularInline):
    """Rows that belong to the run (its timeline, its log), read from the ledger database."""

    extra = max_num = 0
    can_delete = False

    def get_queryset(self, request):
        return tolerant(super().get_queryset(request).using(app_settings.DATABASE))

    def has_view_permission(self, request, obj=None):
        # They are part of the run: whoever may see the run sees them.
        return can_view(request.user, JobRun)


class RunEventInline(RunPartInline):
    model = RunEvent
    fields = readonly_fields = ("time", "kind", "node", "fence", "reason")
    time = time_column(RunEvent, "at")


class RunLogInline(RunPartInline):
    """What the run's handlers logged through ``ctx.logger``, beside its timeline."""

    model = RunLog
    fields = readonly_fields = ("time", "level_name", "attempt", "node", "trace_id", "text")
    time = time_column(RunLog, "at")
    verbose_name_plural = gettext_lazy("log")

    @admin.display(description=gettext_lazy("level"))
    def level_name(self, obj):
        return obj.level_name

    @admin.display(description=gettext_lazy("message"))
    def text(self, obj):
        return pre(obj.message)


@admin.register(JobRun)
class JobRunAdmin(BulkRunActionsMixin, ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    # What an operator scans for at 1366 px (beside the admin's navigation and the filters); the
    # key, outcome, attempt, fence and the other times are on the run's page.
    list_display = ("scheduled", "job", "state", "error_summary", "duration", "node")
    list_display_links = ("scheduled",)
    list_filter = (JobFilter, "state", "outcome", QueueFilter, NodeFilter, ScheduledFilter)
    list_select_related = ("job",)
    # The search matches job names (in the short job table), keys and nodes exactly; see
    # get_search_results. No date hierarchy: listing its years and months scans every run.
    search_fields = ("job__name", "=key", "=node")
    search_help_text = gettext_lazy("A part of a job's name, or a run's exact key or node.")
    show_full_result_count = False
    paginator = LedgerPaginator
    inlines = (RunEventInline, RunLogInline)
    actions = ("cancel_runs", "replay_runs", "replay_dead_letters", "cancel_pending_runs")
    object_actions = (
        ("cancel_runs", gettext_lazy("Cancel")),
        ("replay_runs", gettext_lazy("Replay")),
    )
    fieldsets = (
        (None, {"fields": ("job", "key", "state", "outcome", "reason", "attempt", "priority",
                           "origin", "workflow", "cancel_request")}),
        (gettext_lazy("Ownership"), {"fields": ("node", "fence", "lease_expires")}),
        (gettext_lazy("Times"), {"fields": ("scheduled", "due", "created", "started",
                                            "finished", "duration")}),
        (gettext_lazy("Data"), {"fields": ("payload_json", "result_json", "error_text",
                                           "traceback_text")}),
        (gettext_lazy("Task"), {"fields": ("task_path", "args_json", "kwargs_json"),
                                "classes": ("collapse",)}),
    )  # fmt: skip
    readonly_fields = (
        "workflow", "cancel_request", "lease_expires", "scheduled", "due", "created", "started",
        "finished", "duration", "payload_json", "result_json", "error_text", "traceback_text",
        "task_path", "args_json", "kwargs_json",
    )  # fmt: skip
    scheduled = time_column(JobRun, "scheduled_at")
    due = time_column(JobRun, "due_at")
    created = time_column(JobRun, "created_at")
    started = time_column(JobRun, "started_at")
    finished = time_column(JobRun, "finished_at")
    lease_expires = time_column(JobRun, "lease_expires_at")

    def get_search_results(self, request, queryset, search_term):
        # Django's search would OR a join on the job's name with the runs' own columns, which no
        # index serves: match the job names first (the job table is short); a term no job's
        # name contains is a run's key (looked up per job, on the unique (job, key) index) or
        # a node.
        term = search_term.strip()
        if not term:
            return queryset, False
        jobs = list(ledger(JobDefinition).values_list("pk", "name"))
        named = [pk for pk, name in jobs if term.casefold() in name.casefold()]
        if named:
            return queryset.filter(job_id__in=named), False
        every = [pk for pk, _name in jobs]
        return queryset.filter(Q(job_id__in=every, key=term) | Q(node=term)), False

    def get_queryset(self, request):
        elapsed = ExpressionWrapper(
            F("finished_at") - F("started_at"), output_field=DurationField()
        )
        # Its job read with it: a job row that cannot be read is then named where the run is.
        runs = super().get_queryset(request).select_related("job")
        return runs.annotate(duration_value=elapsed)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("instance/<int:pk>/", wrap(lambda request, pk: instance_view(self, request, pk)),
                 name="cluster_jobs_instance"),
            *super().get_urls(),
        ]  # fmt: skip

    @admin.display(description=gettext_lazy("workflow instance"))
    def workflow(self, obj):
        instance = instance_of(app_settings.DATABASE, obj.pk)
        if instance is None:
            return "-"
        url = reverse(f"{self.admin_site.name}:cluster_jobs_instance", args=[instance.id])
        label = _("instance %(id)s (%(state)s)") % {"id": instance.id, "state": instance.state}
        return format_html('<a href="{}">{}</a>', url, label)

    # -- actions

    def object_action_applies(self, name, obj):
        if name == "cancel_runs":
            return obj.state == RunState.RUNNING and not obj.cancel_requested
        return obj.state not in LIVE_STATES

    @admin.action(description=gettext_lazy("Cancel selected running runs"), permissions=["manage"])
    def cancel_runs(self, request, queryset):
        runs = list(ledger(JobRun).filter(pk__in=_pks(queryset), state=RunState.RUNNING))
        changed = [
            (run, "Cancel requested.")
            for run in runs
            if services.request_cancel(run, by=actor(request, ADMIN))
        ]
        text = ngettext(
            "Cancel requested for %(n)d run; its node stops it at its next heartbeat.",
            "Cancel requested for %(n)d runs; their nodes stop them at their next heartbeat.",
            len(changed),
        ) % {"n": len(changed)}
        if not changed:
            text = _("No run was cancelled: only running runs can be.")
        self.report(request, changed, text, done=bool(changed))

    @admin.action(
        description=gettext_lazy("Replay selected finished runs"), permissions=["trigger"]
    )
    def replay_runs(self, request, queryset):
        runs = list(ledger(JobRun).filter(pk__in=_pks(queryset)).exclude(state__in=LIVE_STATES))
        changed = []
        for run in runs:
            try:
                fresh = services.replay(run, by=actor(request, ADMIN))
            except ImproperlyDeclared as exc:  # a stored run the engine cannot take again
                self.message_user(request, str(exc), messages.WARNING)
                continue
            changed.append((run, f"Replayed as run {fresh.pk}."))
        text = ngettext(
            "%(n)d run replayed as a fresh pending run.",
            "%(n)d runs replayed as fresh pending runs.",
            len(changed),
        ) % {"n": len(changed)}
        if not changed:
            text = _("No run was replayed: only finished runs can be.")
        self.report(request, changed, text, done=bool(changed))

    # -- columns and fields

    @admin.display(description=gettext_lazy("duration"), ordering="duration_value")
    def duration(self, obj):
        if obj.duration_value is None:
            return _("running") if obj.state == RunState.RUNNING else "-"
        return interval_text(obj.duration_value)

    @admin.display(description=gettext_lazy("error"))
    def error_summary(self, obj):
        return Truncator(obj.error.split("\n", 1)[0]).chars(ERROR_SUMMARY) or "-"

    @admin.display(description=gettext_lazy("cancel requested"))
    def cancel_request(self, obj):
        # Plain words, not Django's boolean icons: a request the run outlived is no failure.
        if not obj.cancel_requested:
            return _("No")
        if obj.state == RunState.RUNNING:
            return _("Requested; its node stops it at its next heartbeat.")
        return _("Requested; the run ended as %(state)s.") % {"state": obj.get_state_display()}

    @admin.display(description=gettext_lazy("payload"))
    def payload_json(self, obj):
        return pre(as_json(obj.payload))

    @admin.display(description=gettext_lazy("args"))
    def args_json(self, obj):
        return pre(as_json(obj.args))

    @admin.display(description=gettext_lazy("kwargs"))
    def kwargs_json(self, obj):
        return pre(as_json(obj.kwargs))

    @admin.display(description=gettext_lazy("result"))
    def result_json(self, obj):
        return pre(as_json(obj.result) if obj.result is not None else "")

    @admin.display(description=gettext_lazy("error"))
    def error_text(self, obj):
        return pre(obj.error)

    @admin.display(description=gettext_lazy("traceback"))
    def traceback_text(self, obj):
        return pre(obj.traceback)


def _pks(queryset) -> list:
    return list(queryset.values_list("pk", flat=True))


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    """Every takeover, fence-out, loss and skip across the cluster, newest first."""

    list_display = ("time", "run", "kind", "node", "fence", "reason")
    fields = ("run", "time", "kind", "node", "fence", "reason")
    readonly_fields = ("time",)
    time = time_column(RunEvent, "at")
    list_filter = ("kind",)
    list_select_related = ("run__job",)
    search_fields = ("run__job__name", "run__key", "node", "reason")
    # Newest first by id: events are appended in time order, and the primary key serves it on a
    # ledger of any size (no date hierarchy, which scans every event to list its dates).
    ordering = ("-id",)
    show_full_result_count = False
    paginator = LedgerPaginator

"""Runs in the console: the read-only ledger with its timeline, plus cancel and replay."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import DurationField, ExpressionWrapper, F
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import services
from ..conf import app_settings, ledger
from ..exceptions import ImproperlyDeclared
from ..models import LIVE_STATES, JobDefinition, JobRun, RunEvent, RunState, WorkerNode
from ..permissions import ADMIN, actor, can_view
from ..wording import interval_text
from ..workflows import instance_of
from .base import LedgerDatabaseMixin, OperatorActionsMixin, ReadOnlyMixin
from .overview import instance_view
from .text import as_json, pre, time_column

#: How much of an error's first line the runs list shows.
ERROR_SUMMARY = 50


class LedgerChoicesFilter(admin.SimpleListFilter):
    """A filter whose choices come from a small ledger table (never from the runs themselves)."""

    field = ""

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class JobFilter(LedgerChoicesFilter):
    title, parameter_name, field = gettext_lazy("job"), "job", "job_id"

    def lookups(self, request, model_admin):
        return ledger(JobDefinition).values_list("pk", "name")


class NodeFilter(LedgerChoicesFilter):
    title, parameter_name, field = gettext_lazy("node"), "node", "node"

    def lookups(self, request, model_admin):
        nodes = ledger(WorkerNode).values_list("node_id", flat=True)
        return [(node, node) for node in nodes]


class RunEventInline(ReadOnlyMixin, admin.TabularInline):
    model = RunEvent
    fields = readonly_fields = ("time", "kind", "node", "fence", "reason")
    time = time_column(RunEvent, "at")
    extra = max_num = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).using(app_settings.DATABASE)

    def has_view_permission(self, request, obj=None):
        # The timeline is part of the run: whoever may see the run sees its events.
        return can_view(request.user, JobRun)


@admin.register(JobRun)
class JobRunAdmin(OperatorActionsMixin, ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    # What an operator scans for at 1366 px (beside the admin's navigation and the filters); the
    # key, outcome, attempt, fence and the other times are on the run's page.
    list_display = ("scheduled", "job", "state", "error_summary", "duration", "node")
    list_display_links = ("scheduled",)
    list_filter = (JobFilter, "state", "outcome", NodeFilter)
    list_select_related = ("job",)
    search_fields = ("job__name", "key", "node")
    date_hierarchy = "scheduled_at"
    show_full_result_count = False  # one COUNT(*) of the ledger per page is enough
    inlines = (RunEventInline,)
    actions = ("cancel_runs", "replay_runs")
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

    def get_queryset(self, request):
        elapsed = ExpressionWrapper(
            F("finished_at") - F("started_at"), output_field=DurationField()
        )
        return super().get_queryset(request).annotate(duration_value=elapsed)

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
    date_hierarchy = "at"
    ordering = ("-at", "-id")
    show_full_result_count = False

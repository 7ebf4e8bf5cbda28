"""The admin: job definitions, the run ledger with its timeline, worker nodes and leases.

Ledger rows (runs, events, nodes, leases) are read-only: the scheduler owns them. Operators
change only what the protocol reads back: a job's ``enabled`` flag (the claim SQL refuses
disabled jobs at once, and nodes re-plan when ``updated_at`` moves) and a node's ``draining``
status (the node stops at its next heartbeat).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cron_descriptor import Options, get_description
from django import forms
from django.contrib import admin, messages
from django.db.models import (
    BooleanField,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Now
from django.urls import reverse
from django.utils import formats, timezone, translation
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .conf import app_settings
from .exceptions import ImproperlyDeclared, UnknownJob
from .models import (
    JobDefinition,
    JobRun,
    Lease,
    NodeStatus,
    RunEvent,
    RunState,
    ScheduleKind,
    Source,
    WorkerNode,
)
from .registry import registry
from .schedules import Schedule, from_fields

#: Columns a code declaration writes on every scheduler start (see Job.definition_fields).
CODE_OWNED = (
    "name", "callable_name", "source", "schedule_kind", "cron", "timezone", "interval",
    "placement", "delivery", "overlap", "misfire", "catch_up_window", "catch_up_limit",
    "max_attempts", "backoff", "breaker_threshold", "breaker_cooldown", "timeout", "executor",
    "priority", "queue", "max_concurrency", "requires", "payload",
)  # fmt: skip
FAILURE_STATES = (RunState.FAILED, RunState.TIMED_OUT, RunState.LOST, RunState.DEAD)
MANAGE_PERMISSION = f"{JobDefinition._meta.app_label}.manage_jobdefinition"


# -- text helpers ------------------------------------------------------------------------------


@lru_cache(maxsize=512)
def describe_cron(expr: str, locale_code: str = "en_US") -> str:
    """Return cron-descriptor's reading of ``expr``, or ``expr`` itself when it cannot read it."""
    fields = expr.split()
    if len(fields) == 6:
        # Ours are seconds-first; a 7th (year) field stops cron-descriptor from guessing a year.
        fields.append("*")
    try:
        options = Options(locale_code=locale_code, use_24hour_time_format=True)
        return get_description(" ".join(fields), options)
    except Exception:  # a description is a nicety: never break the page over one
        return expr


def _locale_code() -> str:
    code = translation.to_locale(translation.get_language() or "en-us")
    return code if "_" in code else f"{code}_{code.upper()}"


def interval_text(interval: timedelta | None) -> str:
    """Return ``interval`` as compact units: ``1 h 30 min``, ``2 s``, ``250 ms``."""
    if interval is None:
        return "?"
    ms = int(interval / timedelta(milliseconds=1))
    units = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000), ("ms", 1))
    parts = []
    for name, size in units:
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count} {name}")
    return " ".join(parts) or "0 ms"


def schedule_text(job: JobDefinition) -> str:
    """Return a one-line, human-readable schedule of ``job``."""
    if job.schedule_kind == ScheduleKind.CRON:
        return f"{describe_cron(job.cron, _locale_code())} ({job.timezone})"
    if job.schedule_kind == ScheduleKind.EVERY:
        return _("every %(interval)s") % {"interval": interval_text(job.interval)}
    if job.schedule_kind == ScheduleKind.DELAY:
        return _("%(interval)s after the previous run") % {"interval": interval_text(job.interval)}
    return str(job.get_schedule_kind_display())


def _schedule(job: JobDefinition) -> Schedule | None:
    try:
        return job.get_schedule()
    except (ImproperlyDeclared, ValueError):
        return None


def _when(at: datetime | None) -> str:
    return formats.localize(timezone.localtime(at)) if at else "-"


def _stamp(at: datetime, zone: tzinfo) -> str:
    return at.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def _rows(model, objs) -> QuerySet:
    """A plain queryset of ``objs`` on the ledger database (no admin annotations to update)."""
    return model.objects.using(app_settings.DATABASE).filter(pk__in=[o.pk for o in objs])


def fire_times_table(times: list[datetime], tz: str) -> str:
    """Return ``times`` as an HTML table: one column in ``tz``, one in UTC."""
    try:
        zone = ZoneInfo(tz or "UTC")
    except (ValueError, ZoneInfoNotFoundError):
        zone, tz = UTC, "UTC"
    rows = ((_stamp(at, zone), _stamp(at, UTC)) for at in times)
    body = format_html_join("", "<tr><td>{}</td><td>{}</td></tr>", rows)
    head = format_html("<tr><th>{}</th><th>UTC</th></tr>", tz or "UTC")
    return format_html("<table><thead>{}</thead><tbody>{}</tbody></table>", head, body)


def _pre(text: object) -> str:
    return format_html("<pre>{}</pre>", text) if text not in ("", None) else "-"


# -- database alias ----------------------------------------------------------------------------


class LedgerDatabaseMixin:
    """Read and write the ledger on CLUSTER_JOBS["DATABASE"] (Django's multi-database pattern)."""

    def get_queryset(self, request):
        return super().get_queryset(request).using(app_settings.DATABASE)

    def save_model(self, request, obj, form, change):
        obj.save(using=app_settings.DATABASE)

    def delete_model(self, request, obj):
        obj.delete(using=app_settings.DATABASE)


class ReadOnlyMixin:
    """The scheduler owns these rows: view them, never add, change or delete them here."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


# -- jobs --------------------------------------------------------------------------------------


class JobDefinitionForm(forms.ModelForm):
    """Refuse a schedule or a callable the scheduler could not use, naming the field."""

    class Meta:
        model = JobDefinition
        fields = "__all__"  # noqa: DJ007 - the admin's fieldsets choose what is shown

    def clean(self):
        data = super().clean()
        if "callable_name" in self.fields and data.get("callable_name"):
            self._check_callable(data["callable_name"])
        if "schedule_kind" in self.fields:
            self._check_schedule(data)
        return data

    def _check_callable(self, name: str) -> None:
        if name not in registry:
            self.add_error("callable_name", str(UnknownJob(name, registry.names())))

    def _check_schedule(self, data: dict) -> None:
        kind, interval = data.get("schedule_kind"), data.get("interval")
        if kind in (ScheduleKind.EVERY, ScheduleKind.DELAY) and interval is None:
            self.add_error("interval", _("This kind of schedule needs an interval."))
            return
        try:
            from_fields(kind, data.get("cron", ""), data.get("timezone") or "UTC", interval)
        except ImproperlyDeclared as exc:
            field = {"tz": "timezone", "every": "interval", "delay": "interval"}.get(exc.field)
            self.add_error(field or "cron", exc.hint)


@admin.register(JobDefinition)
class JobDefinitionAdmin(LedgerDatabaseMixin, admin.ModelAdmin):
    form = JobDefinitionForm
    list_display = (
        "name", "schedule", "source", "enabled", "placement", "last_run", "next_fire_time",
    )  # fmt: skip
    list_editable = ("enabled",)
    list_filter = ("enabled", "schedule_kind", "source", "placement")
    search_fields = ("name", "callable_name")
    actions = ("enable_jobs", "disable_jobs")
    fieldsets = (
        (None, {"fields": ("name", "callable_name", "source", "enabled", "paused_until",
                           "pause_reason")}),
        (_("Schedule"), {"fields": ("schedule_kind", "cron", "timezone", "interval",
                                    "schedule_description", "next_fire_times")}),
        (_("Policies"), {"fields": ("placement", "delivery", "overlap", "misfire",
                                    "catch_up_window", "max_attempts", "backoff", "timeout",
                                    "priority", "queue", "max_concurrency", "requires",
                                    "payload")}),
        (_("History"), {"fields": ("last_run_detail", "last_success", "last_failure",
                                   "created_at", "updated_at")}),
    )  # fmt: skip
    computed = ("schedule_description", "next_fire_times")
    history = ("last_run_detail", "last_success", "last_failure", "created_at", "updated_at")

    def get_queryset(self, request):
        latest = JobRun.objects.filter(job=OuterRef("pk"), scheduled_at__lte=timezone.now())
        latest = latest.order_by("-scheduled_at", "-id")
        return (
            super()
            .get_queryset(request)
            .annotate(
                last_run_state=Subquery(latest.values("state")[:1]),
                last_run_at=Subquery(latest.values("scheduled_at")[:1]),
            )
        )

    def get_fieldsets(self, request, obj=None):
        return self.fieldsets if obj else self.fieldsets[:-1]

    def save_model(self, request, obj, form, change):
        # Write only what the operator changed, so a concurrent code sync is not overwritten.
        fields = {*form.changed_data, "updated_at"} if change else None
        obj.save(using=app_settings.DATABASE, update_fields=fields)

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.source == Source.CODE:
            return (*CODE_OWNED, *self.computed, *self.history)
        return ("source", *self.computed, *self.history)

    def has_delete_permission(self, request, obj=None):
        # The code would re-create the row at the next start, and deleting cascades its runs.
        if obj is not None and obj.source == Source.CODE:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # bulk delete would bypass the code-row guard
        return actions

    # -- columns

    @admin.display(description=_("schedule"), ordering="schedule_kind")
    def schedule(self, obj):
        return schedule_text(obj)

    @admin.display(description=_("last run"), ordering="last_run_at")
    def last_run(self, obj):
        if obj.last_run_at is None:
            return "-"
        state = dict(RunState.choices).get(obj.last_run_state, obj.last_run_state)
        return f"{state} · {_when(obj.last_run_at)}"

    @admin.display(description=_("next fire time"))
    def next_fire_time(self, obj):
        if not obj.enabled:
            return _("disabled")
        schedule = _schedule(obj)
        if schedule is None or not schedule.slotted:
            return "-"
        return schedule.next_after(self._start(obj))

    @staticmethod
    def _start(obj) -> datetime:
        now = timezone.now()
        return max(now, obj.paused_until) if obj.paused_until else now

    # -- detail

    @admin.display(description=_("reads as"))
    def schedule_description(self, obj):
        return schedule_text(obj)

    @admin.display(description=_("next 5 fire times"))
    def next_fire_times(self, obj):
        schedule = _schedule(obj)
        if schedule is None:
            return _("None: the schedule is invalid.")
        if not schedule.slotted:
            return self._why_no_fire_times(obj)
        table = fire_times_table(schedule.upcoming(self._start(obj), 5), obj.timezone)
        note = "" if obj.enabled else _("Disabled: these occurrences will be skipped.")
        return format_html("{}{}", table, note)

    @staticmethod
    def _why_no_fire_times(obj) -> str:
        if obj.schedule_kind == ScheduleKind.DELAY:
            return _(
                "None: each run is due %(interval)s after the previous run finished anywhere "
                "in the cluster, so there are no fixed fire times."
            ) % {"interval": interval_text(obj.interval)}
        if obj.schedule_kind == ScheduleKind.STARTUP:
            return _("None: it runs on every node when that node's scheduler starts.")
        return _("None: it runs only when triggered.")

    @admin.display(description=_("last run"))
    def last_run_detail(self, obj):
        return self._run_link(obj.runs.filter(scheduled_at__lte=timezone.now()))

    @admin.display(description=_("last success"))
    def last_success(self, obj):
        return self._run_link(obj.runs.filter(state=RunState.SUCCEEDED))

    @admin.display(description=_("last failure"))
    def last_failure(self, obj):
        return self._run_link(obj.runs.filter(state__in=FAILURE_STATES))

    def _run_link(self, runs: QuerySet) -> str:
        run = runs.using(app_settings.DATABASE).order_by("-scheduled_at", "-id").first()
        if run is None:
            return "-"
        url = reverse(f"{self.admin_site.name}:cluster_jobs_jobrun_change", args=[run.pk])
        label = f"{run.get_state_display()} · {_when(run.finished_at or run.scheduled_at)}"
        return format_html('<a href="{}">{}</a>', url, label)

    # -- actions

    @admin.action(description=_("Enable selected jobs"), permissions=["change"])
    def enable_jobs(self, request, queryset):
        self._set_enabled(request, queryset, enabled=True)

    @admin.action(description=_("Disable selected jobs"), permissions=["change"])
    def disable_jobs(self, request, queryset):
        self._set_enabled(request, queryset, enabled=False)

    def _set_enabled(self, request, queryset, *, enabled: bool) -> None:
        jobs = list(queryset.exclude(enabled=enabled))
        set_enabled(_rows(JobDefinition, jobs), enabled=enabled)
        for job in jobs:
            self.log_change(request, job, "Enabled." if enabled else "Disabled.")
        text = (
            ngettext("%(n)d job enabled.", "%(n)d jobs enabled.", len(jobs))
            if enabled
            else ngettext("%(n)d job disabled.", "%(n)d jobs disabled.", len(jobs))
        )
        self.message_user(request, text % {"n": len(jobs)}, messages.SUCCESS)


def set_enabled(jobs: QuerySet, *, enabled: bool) -> int:
    """Enable or disable ``jobs``; moving updated_at makes every node re-plan at its heartbeat."""
    return jobs.update(enabled=enabled, updated_at=timezone.now())


# -- runs --------------------------------------------------------------------------------------


class LedgerChoicesFilter(admin.SimpleListFilter):
    """A filter whose choices come from a small ledger table (never from the runs themselves)."""

    field = ""

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(**{self.field: value}) if value else queryset


class JobFilter(LedgerChoicesFilter):
    title, parameter_name, field = _("job"), "job", "job_id"

    def lookups(self, request, model_admin):
        return JobDefinition.objects.using(app_settings.DATABASE).values_list("pk", "name")


class NodeFilter(LedgerChoicesFilter):
    title, parameter_name, field = _("node"), "node", "node"

    def lookups(self, request, model_admin):
        nodes = WorkerNode.objects.using(app_settings.DATABASE).values_list("node_id", flat=True)
        return [(node, node) for node in nodes]


class RunEventInline(admin.TabularInline):
    model = RunEvent
    fields = readonly_fields = ("at", "kind", "node", "fence", "reason")
    extra = max_num = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).using(app_settings.DATABASE)

    def has_view_permission(self, request, obj=None):
        # The timeline is part of the run: whoever may see the run sees its events.
        label = JobRun._meta.app_label
        return request.user.has_perm(f"{label}.view_jobrun") or request.user.has_perm(
            f"{label}.change_jobrun"
        )

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    list_display = (
        "job", "key", "state", "outcome", "node", "attempt", "fence", "scheduled_at",
        "started_at", "finished_at", "duration",
    )  # fmt: skip
    list_display_links = ("key",)
    list_filter = (JobFilter, "state", "outcome", NodeFilter)
    list_select_related = ("job",)
    search_fields = ("job__name", "key", "node")
    date_hierarchy = "scheduled_at"
    show_full_result_count = False  # one COUNT(*) of the ledger per page is enough
    inlines = (RunEventInline,)
    fieldsets = (
        (None, {"fields": ("job", "key", "state", "outcome", "reason", "attempt", "priority",
                           "origin", "cancel_requested")}),
        (_("Ownership"), {"fields": ("node", "fence", "lease_expires_at")}),
        (_("Times"), {"fields": ("scheduled_at", "due_at", "created_at", "started_at",
                                 "finished_at", "duration")}),
        (_("Data"), {"fields": ("payload_json", "result_json", "error_text", "traceback_text")}),
    )  # fmt: skip
    readonly_fields = ("duration", "payload_json", "result_json", "error_text", "traceback_text")

    def get_queryset(self, request):
        elapsed = ExpressionWrapper(
            F("finished_at") - F("started_at"), output_field=DurationField()
        )
        return super().get_queryset(request).annotate(duration_value=elapsed)

    @admin.display(description=_("duration"), ordering="duration_value")
    def duration(self, obj):
        if obj.duration_value is None:
            return _("running") if obj.state == RunState.RUNNING else "-"
        return interval_text(obj.duration_value)

    @admin.display(description=_("payload"))
    def payload_json(self, obj):
        return _pre(_json(obj.payload))

    @admin.display(description=_("result"))
    def result_json(self, obj):
        return _pre(_json(obj.result) if obj.result is not None else "")

    @admin.display(description=_("error"))
    def error_text(self, obj):
        return _pre(obj.error)

    @admin.display(description=_("traceback"))
    def traceback_text(self, obj):
        return _pre(obj.traceback)


def _json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    """Every takeover, fence-out, loss and skip across the cluster, newest first."""

    list_display = ("at", "run", "kind", "node", "fence", "reason")
    list_filter = ("kind",)
    list_select_related = ("run__job",)
    search_fields = ("run__job__name", "run__key", "node", "reason")
    date_hierarchy = "at"
    ordering = ("-at", "-id")
    show_full_result_count = False


# -- nodes and leases --------------------------------------------------------------------------


def drain_nodes(nodes: QuerySet) -> int:
    """Ask active ``nodes`` to drain; each stops claiming at its next heartbeat."""
    return nodes.filter(status=NodeStatus.ACTIVE).update(status=NodeStatus.DRAINING)


@admin.register(WorkerNode)
class WorkerNodeAdmin(ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    list_display = (
        "node_id", "host", "pid", "version", "status", "started_at", "last_heartbeat",
        "heartbeat_age", "clock_offset", "claims_won", "claims_lost", "skips", "running_runs",
    )  # fmt: skip
    list_filter = ("status",)
    search_fields = ("node_id", "host")
    actions = ("drain",)
    fields = (
        "node_id", "host", "pid", "version", "tags", "status", "started_at", "last_heartbeat",
        "heartbeat_age", "stopped_at", "clock_offset_ms", "claims_won", "claims_lost", "skips",
        "running_runs",
    )  # fmt: skip
    readonly_fields = ("heartbeat_age", "skips", "running_runs")

    def get_queryset(self, request):
        running = JobRun.objects.filter(node=OuterRef("node_id"), state=RunState.RUNNING)
        count = running.order_by().values("node").annotate(n=Count("pk")).values("n")[:1]
        # Heartbeats are stamped on the database's clock, so their age is measured there too.
        age = ExpressionWrapper(Now() - F("last_heartbeat"), output_field=DurationField())
        return (
            super()
            .get_queryset(request)
            .annotate(running_count=Subquery(count), heartbeat_age_value=age)
        )

    def has_manage_permission(self, request):
        return request.user.has_perm(MANAGE_PERMISSION)

    @admin.display(description=_("heartbeat age"), ordering="heartbeat_age_value")
    def heartbeat_age(self, obj):
        seconds = int(obj.heartbeat_age_value.total_seconds())
        return interval_text(timedelta(seconds=seconds)) if seconds > 0 else _("< 1 s")

    @admin.display(description=_("clock offset (ms)"), ordering="clock_offset_ms")
    def clock_offset(self, obj):
        return f"{obj.clock_offset_ms:+.1f}"

    @admin.display(description=_("skipped"))
    def skips(self, obj):
        return ", ".join(f"{reason}: {n}" for reason, n in sorted(obj.skipped.items())) or "-"

    @admin.display(description=_("running runs"), ordering="running_count")
    def running_runs(self, obj):
        count = obj.running_count or 0
        url = reverse(f"{self.admin_site.name}:cluster_jobs_jobrun_changelist")
        query = urlencode({"node": obj.node_id, "state__exact": RunState.RUNNING})
        return format_html('<a href="{}?{}">{}</a>', url, query, count)

    @admin.action(description=_("Drain selected nodes"), permissions=["manage"])
    def drain(self, request, queryset):
        nodes = list(queryset.filter(status=NodeStatus.ACTIVE))
        drained = drain_nodes(_rows(WorkerNode, nodes))
        for node in nodes:
            self.log_change(request, node, "Drain requested from the admin.")
        text = ngettext(
            "%(n)d node will drain at its next heartbeat.",
            "%(n)d nodes will drain at their next heartbeat.",
            drained,
        ) % {"n": drained}
        self.message_user(request, text, messages.SUCCESS if drained else messages.WARNING)


@admin.register(Lease)
class LeaseAdmin(ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    list_display = ("name", "holder", "fence", "acquired_at", "expires_at", "held")
    search_fields = ("name", "holder")
    fields = ("name", "holder", "fence", "acquired_at", "expires_at", "held")

    def get_queryset(self, request):
        # Leases run on the database's clock, so "held" is decided there too.
        held = ExpressionWrapper(Q(expires_at__gt=Now()), output_field=BooleanField())
        return super().get_queryset(request).annotate(is_held=held)

    @admin.display(description=_("held"), boolean=True, ordering="is_held")
    def held(self, obj):
        return bool(obj.is_held)

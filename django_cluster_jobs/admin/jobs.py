"""Jobs in the console: schedules added without a deploy, fire times, history and actions.

Code-declared jobs keep their schedule and policies read-only (the scheduler rewrites them from
code at every start); operators add database schedules for any registered job here, and every
running node re-plans within a heartbeat because saving moves ``updated_at``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db.models import Count, OuterRef, Q, Subquery
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ..conf import app_settings, ledger
from ..models import JobDefinition, JobRun, JobRunQuerySet, RunEvent, RunState, ScheduleKind, Source
from ..stored import tolerant
from ..validation import is_orphaned, known_names, row_errors, stored_problems
from ..wording import describe_schedule, interval_text
from .base import LedgerDatabaseMixin
from .forms import JobDefinitionForm
from .job_actions import JobActionsMixin, pause_text
from .text import (
    fire_times_around,
    fire_times_table,
    next_offset_change,
    schedule_or_none,
    time_column,
    when,
)

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

#: Fields only an operator sets; everything else on a code job comes from its declaration.
OPERATOR_OWNED = ("enabled", "paused_until", "pause_reason")
#: Columns a code declaration writes on every scheduler start (see Job.definition_fields).
CODE_OWNED = tuple(
    f.name
    for f in JobDefinition._meta.concrete_fields
    if f.editable and not f.primary_key and f.name not in OPERATOR_OWNED
)
MAIN_FIELDS = ("name", "callable_name", "source", "enabled", "pause_state", "problem_list")
SCHEDULE_FIELDS = ("schedule_kind", "cron", "timezone", "interval")
SCHEDULE_PREVIEWS = ("schedule_description", "next_fire_times", "across_dst")
COMPUTED = (
    "pause_state", "problem_list", "schedule_description", "next_fire_times", "across_dst",
    "dependencies",
)  # fmt: skip
HISTORY = (
    "runs_last_day", "last_run_detail", "last_success", "last_failure", "created", "updated",
)  # fmt: skip
#: Every other declared column (retries, breaker, timeouts, …) lands here, so new ones show up.
DEPENDENCY_FIELDS = ("after", "dependencies")
POLICY_FIELDS = tuple(
    f for f in CODE_OWNED if f not in (*MAIN_FIELDS, *SCHEDULE_FIELDS, *DEPENDENCY_FIELDS)
)
DAY = timedelta(hours=24)


class PausedFilter(admin.SimpleListFilter):
    title, parameter_name = _("paused"), "paused"

    def lookups(self, request, model_admin):
        return (("yes", _("Yes")), ("no", _("No")))

    def queryset(self, request, queryset):
        paused = Q(paused_until__gt=timezone.now())
        if self.value() == "yes":
            return queryset.filter(paused)
        return queryset.exclude(paused) if self.value() == "no" else queryset


@admin.register(JobDefinition)
class JobDefinitionAdmin(JobActionsMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    form = JobDefinitionForm
    # What an operator scans for at 1366 px (beside the admin's navigation and the filters); the
    # placement is a filter and on the job's page.
    list_display = (
        "name", "schedule", "source", "enabled", "paused", "last_run", "next_fire_time",
        "problems",
    )  # fmt: skip
    list_editable = ("enabled",)
    list_filter = ("enabled", PausedFilter, "schedule_kind", "source", "placement")
    search_fields = ("name", "callable_name")
    fieldsets = (
        (None, {"fields": MAIN_FIELDS}),
        (_("Schedule"), {"fields": (*SCHEDULE_FIELDS, *SCHEDULE_PREVIEWS)}),
        (_("Policies"), {"fields": POLICY_FIELDS}),
        (_("Dependencies"), {"fields": DEPENDENCY_FIELDS}),
        (_("History"), {"fields": HISTORY}),
    )

    def get_queryset(self, request):
        runs = JobRun.objects.filter(job=OuterRef("pk"))
        latest = runs.scheduled_by(timezone.now()).newest_first()
        return (
            super()
            .get_queryset(request)
            .annotate(
                last_run_state=Subquery(latest.values("state")[:1]),
                last_run_at=Subquery(latest.values("scheduled_at")[:1]),
            )
        )

    created = time_column(JobDefinition, "created_at")
    updated = time_column(JobDefinition, "updated_at")

    def get_fieldsets(self, request, obj=None):
        return self.fieldsets if obj else self.fieldsets[:-1]

    def save_model(self, request, obj, form, change):
        # Write only what the operator changed, so a concurrent code sync is not overwritten.
        fields = {*form.changed_data, "updated_at"} if change else None
        obj.save(using=app_settings.DATABASE, update_fields=fields)

    def get_readonly_fields(self, request, obj=None):
        # Pausing goes through the pause and resume actions (manage permission), not the form.
        if obj is not None and obj.source == Source.CODE:
            fields = (*CODE_OWNED, *COMPUTED, *HISTORY)
        else:
            fields = ("source", *COMPUTED, *HISTORY)
        # Switching a job on or off is the enable and disable actions' permission.
        return fields if self.has_manage_permission(request) else (*fields, "enabled")

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        if not self.has_manage_permission(request):
            changelist.list_editable = ()  # as Django does for a popup: no form, no save
        return changelist

    def has_delete_permission(self, request, obj=None):
        # The code would re-create the row at the next start, and deleting cascades its runs;
        # an orphaned code row (its code renamed or removed) is no one's to re-create.
        if obj is not None and obj.source == Source.CODE and not is_orphaned(obj):
            return False
        return super().has_delete_permission(request, obj)

    def delete_view(self, request, object_id, extra_context=None):
        # Before the operator confirms: the jobs that wait for this one, which it would leave
        # never queued (each then says why, and check W007 warns; nothing stops).
        if request.method == "GET":
            job = self.get_object(request, unquote(object_id))
            if job is not None and self.has_delete_permission(request, job):
                self._warn_dependents(request, job.name, _(
                    "Jobs that wait for %(job)s: %(dependents)s. Once it is deleted, they are "
                    "never queued until it is defined again or removed from their predecessors."
                ))  # fmt: skip
        return super().delete_view(request, object_id, extra_context)

    def delete_model(self, request, obj):
        name = obj.name
        super().delete_model(request, obj)
        self._warn_dependents(request, name, _(
            "Jobs that waited for %(job)s: %(dependents)s. They are no longer queued: define "
            "it again or remove it from their predecessors."
        ))  # fmt: skip

    def _warn_dependents(self, request, name: str, text) -> None:
        dependents = ledger(JobDefinition).dependents_of(name).values_list("name", flat=True)
        if names := sorted(dependents):
            messages.warning(request, text % {"dependents": ", ".join(names), "job": name})

    def get_deleted_objects(self, objs, request):
        # A job's runs and their events go with it, though the ledger's own pages delete none.
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        cascaded = {str(model._meta.verbose_name) for model in (JobRun, RunEvent)}
        return deleted, counts, perms_needed - cascaded, protected

    def get_actions(self, request, action_location=None):
        # Django 6.1 passes action_location (change list or change form); 5.2 knows none.
        if action_location is None:
            actions = super().get_actions(request)
        else:
            # django-stubs gives get_actions Django 6's signature only when checking for Python
            # 3.12+ (Django 6 needs it); mypy checks for 3.11, the oldest Python we support.
            actions = super().get_actions(  # type: ignore[call-arg]
                request, action_location=action_location
            )
        actions.pop("delete_selected", None)  # bulk delete would bypass the code-row guard
        return actions

    # -- columns

    @admin.display(description=_("schedule"), ordering="schedule_kind")
    def schedule(self, obj):
        return describe_schedule(obj)

    @admin.display(description=_("paused"), ordering="paused_until")
    def paused(self, obj):
        return pause_text(obj) or "-"

    @admin.display(description=_("last run"), ordering="last_run_at")
    def last_run(self, obj):
        if obj.last_run_at is None:
            return "-"
        state = dict(RunState.choices).get(obj.last_run_state, obj.last_run_state)
        return f"{state} · {when(obj.last_run_at)}"

    @admin.display(description=_("problems"))
    def problems(self, obj):
        found = row_errors(obj)
        if not found:
            return "-"
        if is_orphaned(obj):
            return _("orphaned")
        return _("invalid: %(fields)s") % {"fields": ", ".join(p.field for p in found)}

    @admin.display(description=_("next fire time"))
    def next_fire_time(self, obj):
        if not obj.enabled:
            return _("disabled")
        return when(next(iter(obj.upcoming(timezone.now(), 1)), None))

    # -- detail

    @admin.display(description=_("paused"))
    def pause_state(self, obj):
        return pause_text(obj) or _("No")

    @admin.display(description=_("problems"))
    def problem_list(self, obj):
        # With a predecessor deleted since: the job is never queued after it.
        found = stored_problems(obj, known_names(app_settings.DATABASE)) if obj.pk else []
        if not found:
            return _("None: the scheduler can use this definition.")
        return format_html_join("", "<p>{}</p>", ((str(p),) for p in found))

    @admin.display(description=_("predecessors and dependents"))
    def dependencies(self, obj):
        """The jobs this one waits for and the jobs that wait for it, each a link."""
        after = obj.after if isinstance(obj.after, list) else []
        names = ledger(JobDefinition).filter(name__in=after).values_list("name", "pk")
        dependents = ledger(JobDefinition).dependents_of(obj.name).values_list("name", "pk")
        before = self._job_links(dict(names), after) or _("none (a root or a lone job)")
        following = self._job_links(dict(dependents), sorted(dict(dependents))) or _("none")
        return format_html(
            "<p>{}: {}</p><p>{}: {}</p>", _("Runs after"), before, _("Runs before"), following
        )

    def _job_links(self, pks: dict[str, int], names: list[str]) -> str:
        url = f"{self.admin_site.name}:cluster_jobs_jobdefinition_change"
        return format_html_join(", ", "{}", (
            (format_html('<a href="{}">{}</a>', reverse(url, args=[pks[n]]), n)
             if n in pks else format_html("{} ({})", n, _("unknown: never queued after it")),)
            for n in names
        ))  # fmt: skip

    @admin.display(description=_("reads as"))
    def schedule_description(self, obj):
        return describe_schedule(obj)

    @admin.display(description=_("next 5 fire times"))
    def next_fire_times(self, obj):
        schedule = schedule_or_none(obj)
        if schedule is None:
            return _("None: the schedule is invalid.")
        if not schedule.slotted:
            return self._why_no_fire_times(obj)
        table = fire_times_table(obj.upcoming(timezone.now(), 5), obj.timezone)
        note = "" if obj.enabled else _("Disabled: these occurrences will be skipped.")
        return format_html("{}{}", table, note)

    @admin.display(description=_("fire times across the next DST change"))
    def across_dst(self, obj):
        schedule = schedule_or_none(obj)
        if schedule is None or not schedule.slotted:
            return "-"
        change = next_offset_change(obj.timezone, timezone.now())
        if change is None:
            return _("%(tz)s changes no clock within a year.") % {"tz": obj.timezone or "UTC"}
        text = _("The clocks of %(tz)s change at %(at)s UTC:") % {
            "tz": obj.timezone, "at": f"{change:%Y-%m-%d %H:%M}",
        }  # fmt: skip
        table = fire_times_table(fire_times_around(schedule, change), obj.timezone)
        return format_html("<p>{}</p>{}", text, table)

    @staticmethod
    def _why_no_fire_times(obj) -> StrOrPromise:
        if obj.schedule_kind == ScheduleKind.DELAY:
            return _(
                "None: each run is due %(interval)s after the previous run finished anywhere "
                "in the cluster, so there are no fixed fire times."
            ) % {"interval": interval_text(obj.interval)}
        if obj.schedule_kind == ScheduleKind.STARTUP:
            return _("None: it runs on every node when that node's scheduler starts.")
        return _("None: it runs only when triggered.")

    @admin.display(description=_("runs in the last 24 hours"))
    def runs_last_day(self, obj):
        since = timezone.now() - DAY
        counts = dict(
            ledger(JobRun)
            .filter(job_id=obj.pk, scheduled_at__gte=since)
            .order_by()
            .values_list("state")
            .annotate(n=Count("pk"))
        )
        if not counts:
            return _("None")
        url = reverse(f"{self.admin_site.name}:cluster_jobs_jobrun_changelist")
        rows = (
            (f"{url}?{urlencode(self._runs_query(obj, state, since))}", label, counts[state])
            for state, label in RunState.choices
            if state in counts
        )
        return format_html_join(" · ", '<a href="{}">{}: {}</a>', rows)

    @staticmethod
    def _runs_query(obj, state: str, since: datetime) -> dict[str, str]:
        return {"job": obj.pk, "state__exact": state, "scheduled_at__gte": since.isoformat()}

    @admin.display(description=_("last run"))
    def last_run_detail(self, obj):
        return self._run_link(obj.runs.scheduled_by(timezone.now()))

    @admin.display(description=_("last success"))
    def last_success(self, obj):
        return self._run_link(obj.runs.succeeded())

    @admin.display(description=_("last failure"))
    def last_failure(self, obj):
        return self._run_link(obj.runs.failures())

    def _run_link(self, runs: JobRunQuerySet) -> str:
        run = tolerant(runs.using(app_settings.DATABASE).newest_first()).first()
        if run is None:
            return "-"
        url = reverse(f"{self.admin_site.name}:cluster_jobs_jobrun_change", args=[run.pk])
        label = f"{run.get_state_display()} · {when(run.finished_at or run.scheduled_at)}"
        return format_html('<a href="{}">{}</a>', url, label)

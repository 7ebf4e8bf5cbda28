"""Operator actions on jobs: run now (trigger), pause, resume, enable and disable (manage)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import conditional_escape, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import services
from ..conf import ledger
from ..models import JobDefinition, JobRun
from ..permissions import ADMIN, actor
from ..registry import registry
from .base import FROM_OBJECT, OperatorActionsMixin
from .forms import PauseForm
from .text import when


def pause_text(job: JobDefinition) -> str:
    """Return ``until …: reason`` while ``job`` is paused (by an operator or a breaker)."""
    until = job.paused_until
    if until is None or until <= timezone.now():
        return ""
    span = _("until resumed") if until >= services.FOREVER else _("until %s") % when(until)
    return f"{span}: {job.pause_reason}" if job.pause_reason else span


def _selected(queryset) -> list[JobDefinition]:
    # The changelist's queryset carries display annotations; act on plain rows.
    return list(ledger(JobDefinition).filter(pk__in=list(queryset.values_list("pk", flat=True))))


class JobActionsMixin(OperatorActionsMixin):
    actions = ("run_now", "pause_jobs", "resume_jobs", "enable_jobs", "disable_jobs")
    object_actions = (
        ("run_now", gettext_lazy("Run now")),
        ("pause_jobs", gettext_lazy("Pause…")),
        ("resume_jobs", gettext_lazy("Resume")),
    )

    def object_action_applies(self, name, obj):
        paused = bool(pause_text(obj))
        return {"pause_jobs": not paused, "resume_jobs": paused}.get(name, True)

    @admin.action(description=gettext_lazy("Run selected jobs now"), permissions=["trigger"])
    def run_now(self, request, queryset):
        jobs = _selected(queryset)
        runnable = [job for job in jobs if job.callable_name in registry]
        runs = [(job, services.trigger(job.name, by=actor(request, ADMIN))) for job in runnable]
        changed = [(job, f"Run now: queued run {run.pk}.") for job, run in runs]
        text = ngettext(
            "%(n)d run queued (%(runs)s); it starts as soon as a node is free.",
            "%(n)d runs queued (%(runs)s); they start as soon as a node is free.",
            len(runs),
        )
        links = format_html_join(", ", '<a href="{}">{} {}</a>', self._run_links(runs))
        # The translated words are escaped; the links are built escaped.
        html = mark_safe(conditional_escape(text) % {"n": len(runs), "runs": links})
        self.report(request, changed, html, done=bool(runs))
        self._warn_unregistered(request, [job for job in jobs if job not in runnable])

    def _run_links(self, runs: list[tuple[JobDefinition, JobRun]]):
        name = f"{self.admin_site.name}:cluster_jobs_jobrun_change"
        return ((reverse(name, args=[run.pk]), _("run"), run.pk) for _job, run in runs)

    def _warn_unregistered(self, request, jobs: list[JobDefinition]) -> None:
        if jobs:
            names = ", ".join(sorted(job.callable_name for job in jobs))
            text = _("Not run: no registered code for %(names)s.") % {"names": names}
            self.message_user(request, text, messages.WARNING)

    @admin.action(description=gettext_lazy("Pause selected jobs…"), permissions=["manage"])
    def pause_jobs(self, request, queryset):
        jobs = _selected(queryset)
        form = PauseForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._pause_page(request, jobs, form)
        length = form.length()
        until = timezone.now() + length if length else None
        by, reason = actor(request, ADMIN), form.cleaned_data["reason"]
        for job in jobs:
            services.pause(job.name, until=until, reason=reason, by=by)
        reason = services.pause_reason(reason, by)
        span = _("until %s") % when(until) if until else _("until resumed")
        changed = [(job, f"Paused {span}: {reason}") for job in jobs]
        text = ngettext("%(n)d job paused %(span)s.", "%(n)d jobs paused %(span)s.", len(jobs))
        text %= {"n": len(jobs), "span": span}
        self.report(request, changed, text)
        return None

    def _pause_page(self, request, jobs: list[JobDefinition], form: PauseForm):
        context = {
            **self.admin_site.each_context(request),
            "title": _("Pause jobs"),
            "opts": self.model._meta,
            "jobs": jobs,
            "form": form,
            "action": "pause_jobs",
            "from_object": FROM_OBJECT in request.POST,
        }
        return TemplateResponse(request, "admin/cluster_jobs/pause_jobs.html", context)

    @admin.action(description=gettext_lazy("Resume selected jobs"), permissions=["manage"])
    def resume_jobs(self, request, queryset):
        jobs = [job for job in _selected(queryset) if job.paused_until is not None]
        changed = [
            (job, "Resumed.") for job in jobs if services.resume(job.name, by=actor(request, ADMIN))
        ]
        text = ngettext("%(n)d job resumed.", "%(n)d jobs resumed.", len(changed)) % {
            "n": len(changed)
        }
        self.report(request, changed, text, done=bool(changed))

    @admin.action(description=gettext_lazy("Enable selected jobs"), permissions=["manage"])
    def enable_jobs(self, request, queryset):
        self._set_enabled(request, queryset, enabled=True)

    @admin.action(description=gettext_lazy("Disable selected jobs"), permissions=["manage"])
    def disable_jobs(self, request, queryset):
        self._set_enabled(request, queryset, enabled=False)

    def _set_enabled(self, request, queryset, *, enabled: bool) -> None:
        jobs = {job.name: job for job in _selected(queryset)}
        names = services.set_enabled(list(jobs), enabled=enabled, by=actor(request, ADMIN))
        changed = [(jobs[name], "Enabled." if enabled else "Disabled.") for name in names]
        text = (
            ngettext("%(n)d job enabled.", "%(n)d jobs enabled.", len(names))
            if enabled
            else ngettext("%(n)d job disabled.", "%(n)d jobs disabled.", len(names))
        )
        self.report(request, changed, text % {"n": len(names)}, done=bool(names))

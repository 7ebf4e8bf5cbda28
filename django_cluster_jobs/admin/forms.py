"""Forms of the console: a job definition the scheduler can use, and a pause with its terms."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import available_timezones

from django import forms
from django.forms.fields import InvalidJSONInput
from django.utils.translation import gettext_lazy as _

from ..conf import ledger
from ..models import JobDefinition, Source
from ..registry import registry
from ..stored import Unreadable
from ..validation import definition_errors, graph_errors, orphaned, registered


@lru_cache(maxsize=1)
def _zones() -> tuple[str, ...]:
    return tuple(sorted(available_timezones()))


def zone_choices(current: str) -> list[tuple[str, str]]:
    """The IANA zones this system knows, plus the stored one (never silently replaced)."""
    zones = _zones()
    extra = [current] if current and current not in zones else []
    return [(zone, zone) for zone in (*zones, *extra)]


def callable_choices(current: str) -> list[tuple[str, str]]:
    """The registered job names, plus the stored one if its code is gone (so it is visible)."""
    names = registry.names()
    choices = [("", "---------"), *((name, name) for name in names)]
    if current and current not in names:
        choices.append((current, _("%(name)s (not registered)") % {"name": current}))
    return choices


class JobDefinitionForm(forms.ModelForm):
    """Refuse what the scheduler could not use, as an error on the field at fault."""

    class Meta:
        model = JobDefinition
        fields = "__all__"  # noqa: DJ007 - the admin's fieldsets choose what is shown

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "callable_name" in self.fields:
            choices = callable_choices(self.instance.callable_name)
            self.fields["callable_name"].widget = forms.Select(choices=choices)
        if "timezone" in self.fields and _zones():
            choices = zone_choices(self.instance.timezone)
            self.fields["timezone"].widget = forms.Select(choices=choices)
        for name, field in self.fields.items():
            if isinstance(field, forms.JSONField):
                field.decoder = None  # what is typed is read as JSON; the validator judges it
            if isinstance(self.initial.get(name), Unreadable):
                # Shown as its reason; saved unchanged it is refused as invalid JSON, so the
                # operator writes a value, and the stored one is never replaced by a marker.
                self.initial[name] = InvalidJSONInput(str(self.initial[name]))

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if "name" in self.fields and data.get("name"):
            self._check_name(data["name"])
        name = data.get("name") or self.instance.name or _("(new job)")
        callable_name = data.get("callable_name", self.instance.callable_name)
        handler = registered(callable_name)
        given = {field: value for field, value in data.items() if field in self.fields}
        problems = definition_errors(given, job=str(name), handler=handler)
        if "callable_name" in self.fields and callable_name and handler is None:
            problems.insert(0, orphaned(str(name), callable_name, self.instance.source))
        if "after" in self.fields and not problems:
            problems = self._graph_problems(str(name), data.get("after"))
        for problem in problems:
            # A field the form does not show (a code job's) is the page's problems list's to show.
            if problem.field in self.fields:
                self.add_error(problem.field, str(problem))
        return data

    def _graph_problems(self, name: str, after: Any) -> list:
        """What this job's predecessors add to the stored and declared dependencies: an
        unknown job, or a cycle through this one."""
        if not after:
            return []
        jobs = ledger(JobDefinition).exclude(pk=self.instance.pk)
        graph = {job.name: list(job.after) for job in registry if job.after}
        graph.update(jobs.predecessors())
        known = {*registry.names(), *jobs.values_list("name", flat=True), name}
        before = {str(problem) for problem in graph_errors(graph, known)}
        found = graph_errors({**graph, name: list(after)}, known)
        return [problem for problem in found if str(problem) not in before]

    def _check_name(self, name: str) -> None:
        # The scheduler upserts code jobs by name: it would take this row over at its next start.
        if name in registry and self.instance.source != Source.CODE:
            self.add_error(
                "name",
                _(
                    "%(name)s is the name of a job declared in code. Give this schedule a name "
                    "of its own and choose %(name)s as its callable."
                )
                % {"name": name},
            )


class PauseForm(forms.Form):
    """How long to pause and why; the reason is shown in the job list."""

    FOREVER = ""
    FOR = (
        (FOREVER, _("until resumed")),
        ("900", _("for 15 minutes")),
        ("3600", _("for 1 hour")),
        ("14400", _("for 4 hours")),
        ("86400", _("for 1 day")),
        ("604800", _("for 1 week")),
    )

    duration = forms.ChoiceField(label=_("Pause"), choices=FOR, required=False)
    reason = forms.CharField(
        label=_("Reason"), max_length=150, required=False, help_text=_("Shown in the job list.")
    )

    def length(self) -> timedelta | None:
        """The chosen pause length; None pauses until an operator resumes the job."""
        seconds = self.cleaned_data["duration"]
        return timedelta(seconds=int(seconds)) if seconds else None

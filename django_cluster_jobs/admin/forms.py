"""Forms of the console: a job definition the scheduler can use, and a pause with its terms."""

from __future__ import annotations

import inspect
from datetime import timedelta
from functools import lru_cache
from zoneinfo import available_timezones

from django import forms
from django.utils.translation import gettext_lazy as _

from ..exceptions import ImproperlyDeclared, InvalidPayload, UnknownJob
from ..models import JobDefinition, ScheduleKind, Source
from ..registry import check_payload, registry
from ..schedules import from_fields

#: Which form field an ImproperlyDeclared from the schedule code is about.
SCHEDULE_FIELDS = {"tz": "timezone", "every": "interval", "delay": "interval"}


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

    def clean(self):
        data = super().clean()
        if "name" in self.fields and data.get("name"):
            self._check_name(data["name"])
        if "callable_name" in self.fields and data.get("callable_name"):
            self._check_callable(data["callable_name"])
        if "schedule_kind" in self.fields:
            self._check_schedule(data)
        if "payload" in self.fields and "payload" in data:
            self._check_payload(data.get("callable_name"), data["payload"])
        if "requires" in self.fields and "requires" in data:
            self._check_requires(data["requires"])
        return data

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
            self.add_error(SCHEDULE_FIELDS.get(exc.field, "cron"), exc.hint)

    def _check_payload(self, callable_name: str | None, payload: object) -> None:
        if not isinstance(payload, dict):
            self.add_error(
                "payload",
                _('The payload must be a JSON object of keyword arguments, like {"value": 3}.'),
            )
            return
        try:
            check_payload(callable_name or "?", payload)
        except InvalidPayload as exc:
            self.add_error("payload", str(exc))
            return
        if callable_name in registry:
            self._check_arguments(callable_name, payload)

    def _check_arguments(self, callable_name: str, payload: dict) -> None:
        declared = registry.get(callable_name)
        context = (None,) if declared.wants_context else ()
        try:
            inspect.signature(declared.func).bind_partial(*context, **payload)
        except TypeError as exc:
            self.add_error(
                "payload",
                _("%(job)s cannot take this payload as keyword arguments: %(error)s.")
                % {"job": callable_name, "error": exc},
            )

    def _check_requires(self, requires: object) -> None:
        if not isinstance(requires, list) or not all(isinstance(t, str) for t in requires):
            self.add_error(
                "requires", _('List the node tags the job needs as strings, like ["gpu"].')
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

"""What the API shows of jobs, runs, events and nodes, and what its actions accept.

Times are ISO-8601 strings; durations are seconds (``*_seconds``), as in the status report.
Serializers that need the time take ``now`` (the cluster's clock) from their context.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast, overload

from django.db import models
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings

from ..conf import app_settings
from ..exceptions import ImproperlyDeclared, UnknownJob
from ..models import JobDefinition, JobRun, Outcome, RunEvent, RunLog, RunState, WorkerNode
from ..permissions import can_view
from ..registry import Job, registry
from ..stored import Unreadable, tolerant
from ..validation import (
    KEY_MAX_LENGTH,
    PAUSE_REASON_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    check_run_inputs,
    definition_errors,
    known_names,
    stored_problems,
)
from ..wording import REPORT_LANGUAGE, describe_schedule

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    class RunningCount(TypedDict):
        running_count: int | None

    #: A node as the API's queryset annotates it.
    CountedNode = WithAnnotations[WorkerNode, RunningCount]


class WithLastRuns(Protocol):
    """A job that :func:`attach_last_runs` was given: its last runs by field name."""

    last_runs: dict[str, JobRun | None]


#: How many fire times a job's detail lists.
FIRE_TIMES = 5
#: A job's latest runs, each annotated as ``<name>_id`` by ``JobDefinition.objects.with_last_runs``.
LAST_RUNS = ("last_run", "last_success", "last_failure")


@overload
def iso(at: datetime) -> str: ...
@overload
def iso(at: None) -> None: ...
@overload
def iso(at: datetime | None) -> str | None: ...
def iso(at: datetime | None) -> str | None:
    """Return ``at`` as the API writes times, None as None."""
    return None if at is None else serializers.DateTimeField().to_representation(at)


@extend_schema_field({"type": "number", "format": "double", "nullable": True})
class SecondsField(serializers.ReadOnlyField):
    """A duration as seconds (a float)."""

    def to_representation(self, value):
        return value.total_seconds()


# -- runs ---------------------------------------------------------------------------------------


class StoredJSONField(serializers.JSONField):
    """A JSON column as stored; a value no decoder can read (see ``stored.Unreadable``) shows
    as its reason, a string, never a 500."""

    def to_representation(self, value: Any) -> Any:
        return str(value) if isinstance(value, Unreadable) else super().to_representation(value)


class LedgerSerializer(serializers.ModelSerializer):
    """A model of the ledger: its JSON columns through StoredJSONField."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.JSONField: StoredJSONField,
    }


# Any JSON value, null included: a nullable field would make the schema say "any or null",
# which a 3.1 validator reads as two matching alternatives.
@extend_schema_field({"description": "What the handler returned (any JSON value), or null."})
class ResultField(StoredJSONField):
    """A run's result."""


class RunSummarySerializer(LedgerSerializer):
    """A run as a job shows it: what happened and when (the error's first line only)."""

    error = serializers.SerializerMethodField()

    class Meta:
        model = JobRun
        fields = (
            "id", "key", "state", "outcome", "scheduled_at", "started_at", "finished_at", "node",
            "error",
        )  # fmt: skip
        read_only_fields = fields

    def get_error(self, run: JobRun) -> str:
        return run.error.split("\n", 1)[0]


RUN_FIELDS = (
    "id", "job", "key", "state", "outcome", "reason", "attempt", "priority", "node", "fence",
    "lease_expires_at", "cancel_requested", "origin", "instance", "scheduled_at", "due_at",
    "created_at", "started_at", "finished_at", "payload", "result", "error",
)  # fmt: skip


class RunSerializer(LedgerSerializer):
    """A run in a list (select the job with it)."""

    job: serializers.SlugRelatedField[JobDefinition] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )
    result = ResultField(read_only=True)

    class Meta:
        model = JobRun
        fields: tuple[str, ...] = RUN_FIELDS
        read_only_fields: tuple[str, ...] = fields


class RunEventSerializer(LedgerSerializer):
    class Meta:
        model = RunEvent
        fields = ("at", "kind", "node", "fence", "reason")
        read_only_fields = fields


class RunLogSerializer(LedgerSerializer):
    """One line a handler logged, with the level's name (``INFO``, ``WARNING``, …)."""

    level = serializers.CharField(source="level_name", read_only=True)

    class Meta:
        model = RunLog
        fields = ("at", "level", "attempt", "node", "trace_id", "message")
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    """A run with its traceback, its timeline and its log (prefetch ``events`` and ``logs``)."""

    events = RunEventSerializer(many=True, read_only=True)
    logs = RunLogSerializer(many=True, read_only=True)

    class Meta(RunSerializer.Meta):
        fields: tuple[str, ...] = (*RUN_FIELDS, "traceback", "events", "logs")
        read_only_fields: tuple[str, ...] = fields


# -- jobs ---------------------------------------------------------------------------------------


def attach_last_runs(jobs: list[JobDefinition]) -> None:
    """Load the annotated last runs of ``jobs`` in one query, as ``job.last_runs``."""
    ids = {getattr(job, f"{name}_id") for job in jobs for name in LAST_RUNS} - {None}
    stored = tolerant(JobRun.objects.using(app_settings.DATABASE).filter(pk__in=ids))
    runs = {run.pk: run for run in stored} if ids else {}
    for job in jobs:
        loaded = {name: runs.get(getattr(job, f"{name}_id")) for name in LAST_RUNS}
        cast(WithLastRuns, job).last_runs = loaded


@extend_schema_field(RunSummarySerializer(allow_null=True))
class LastRunField(serializers.ReadOnlyField):
    """The job's run of this field's name among those :func:`attach_last_runs` loaded."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(source="*", **kwargs)

    def to_representation(self, job: JobDefinition) -> dict[str, Any] | None:
        if self.field_name is None:  # set when the field is bound to its serializer
            raise TypeError("LastRunField is read only through a serializer")
        run = getattr(job, "last_runs", {}).get(self.field_name)
        return None if run is None else RunSummarySerializer(run).data


def viewer_sees_runs(context: Mapping[str, Any]) -> bool:
    """Whether the request's user may see runs (a run's error, node and key are run data).

    A job's last runs are shown only to a viewer who may view runs, as the runs endpoint would
    show them; without a request (a serializer used in code) they are shown.
    """
    request = context.get("request")
    return request is None or can_view(request.user, JobRun)


class JobListSerializer(serializers.ListSerializer):
    """Load every job's last runs in one query before serializing the list."""

    def to_representation(self, data):
        jobs = list(data)
        if viewer_sees_runs(self.context):
            attach_last_runs(jobs)
        return super().to_representation(jobs)


JOB_FIELDS = (
    "name", "callable_name", "source", "schedule_kind", "cron", "timezone", "interval_seconds",
    "description", "enabled", "paused", "paused_until", "pause_reason", "next_fire_time",
    "last_run", "last_success", "last_failure", "placement", "delivery", "overlap", "misfire",
    "catch_up_window_seconds", "catch_up_limit", "max_attempts", "backoff", "breaker_threshold",
    "breaker_cooldown_seconds", "executor", "timeout_seconds", "priority", "queue",
    "max_concurrency", "requires", "after", "payload", "problems", "created_at", "updated_at",
)  # fmt: skip


class JobSerializer(LedgerSerializer):
    """A job definition with its schedule read aloud, pause, next fire time and last runs.

    The queryset must come through ``JobDefinition.objects.with_last_runs``. ``paused_until`` and
    ``pause_reason`` are null and empty once a pause has ended; a job paused until resumed
    shows ``paused_until`` 9999-12-31 and no fire times.
    """

    interval_seconds = SecondsField(source="interval")
    catch_up_window_seconds = SecondsField(source="catch_up_window")
    breaker_cooldown_seconds = SecondsField(source="breaker_cooldown")
    timeout_seconds = SecondsField(source="timeout")
    description = serializers.SerializerMethodField()
    paused = serializers.SerializerMethodField()
    paused_until = serializers.SerializerMethodField()
    pause_reason = serializers.SerializerMethodField()
    next_fire_time = serializers.SerializerMethodField()
    last_run = LastRunField()
    last_success = LastRunField()
    last_failure = LastRunField()
    problems = serializers.SerializerMethodField(
        help_text="Why no node plans the job (the validator's verdict); empty when it is usable."
    )

    class Meta:
        model = JobDefinition
        fields: tuple[str, ...] = JOB_FIELDS
        read_only_fields: tuple[str, ...] = fields
        list_serializer_class = JobListSerializer

    def to_representation(self, instance):
        if not hasattr(instance, "last_runs") and viewer_sees_runs(self.context):
            attach_last_runs([instance])
        return super().to_representation(instance)

    @property
    def now(self) -> datetime:
        return self.context.get("now") or timezone.now()

    def get_description(self, job: JobDefinition) -> str:
        return describe_schedule(job, REPORT_LANGUAGE)

    def get_paused(self, job: JobDefinition) -> bool:
        return job.is_paused_at(self.now)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_paused_until(self, job: JobDefinition) -> str | None:
        return iso(job.paused_until) if job.is_paused_at(self.now) else None

    def get_pause_reason(self, job: JobDefinition) -> str:
        return job.pause_reason if job.is_paused_at(self.now) else ""

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_fire_time(self, job: JobDefinition) -> str | None:
        times = job.fire_times(self.now, 1)
        return iso(times[0]) if times else None

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_problems(self, job: JobDefinition) -> list[str]:
        context = cast(dict[str, Any], self.context)  # a list's jobs share their root's
        known = context.get("known_jobs")
        if known is None:  # once per response
            known = context["known_jobs"] = known_names(app_settings.DATABASE)
        return [str(problem) for problem in stored_problems(job, known)]


class JobDetailSerializer(JobSerializer):
    """A job with its next few fire times."""

    next_fire_times = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields: tuple[str, ...] = (*JOB_FIELDS, "next_fire_times")
        read_only_fields: tuple[str, ...] = fields

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_next_fire_times(self, job: JobDefinition) -> list[str]:
        return [iso(at) for at in job.fire_times(self.now, FIRE_TIMES)]


# -- workflow instances -------------------------------------------------------------------------


class InstanceSerializer(LedgerSerializer):
    """A workflow instance in a list: the root's run that started it (its id is the instance's)."""

    job: serializers.SlugRelatedField[JobDefinition] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, help_text="The root job."
    )
    root_state = serializers.CharField(
        source="state", read_only=True,
        help_text="The state of the root's run, a run state (the detail gives the instance's).",
    )  # fmt: skip

    class Meta:
        model = JobRun
        fields = ("id", "job", "root_state", "scheduled_at", "created_at", "finished_at")
        read_only_fields = fields


class StepSerializer(serializers.Serializer):
    """One job of an instance and its run there (null while it waits for its predecessors)."""

    job = serializers.CharField(read_only=True)
    after = serializers.ListField(child=serializers.CharField(), read_only=True)
    state = serializers.CharField(
        read_only=True, help_text="Its run's state, or 'waiting' while it has no run yet."
    )
    run = serializers.SerializerMethodField()

    def get_run(self, step: Any) -> int | None:
        return step.run.pk if step.run is not None else None


class InstanceDetailSerializer(serializers.Serializer):
    """A workflow instance: its state, each job's step in dependency order, and its runs."""

    id = serializers.IntegerField(read_only=True)
    job = serializers.CharField(source="root.job.name", read_only=True)
    state = serializers.CharField(
        read_only=True,
        help_text="succeeded when every job did; failed when one ended without success and "
        "nothing is live; else running.",
    )
    steps = StepSerializer(many=True, read_only=True)
    runs = serializers.SerializerMethodField()

    @extend_schema_field(RunSerializer(many=True))
    def get_runs(self, instance: Any) -> Any:
        runs = [step.run for step in instance.steps if step.run is not None]
        return RunSerializer(runs, many=True, context=self.context).data


# -- nodes --------------------------------------------------------------------------------------


class NodeSerializer(LedgerSerializer):
    """A node with its heartbeat age (on the cluster's clock) and its running runs (annotated)."""

    heartbeat_age_seconds = serializers.SerializerMethodField()
    running_runs = serializers.SerializerMethodField()

    class Meta:
        model = WorkerNode
        fields: tuple[str, ...] = (
            "node_id", "host", "pid", "version", "tags", "status", "started_at", "last_heartbeat",
            "heartbeat_age_seconds", "stopped_at", "clock_offset_ms", "claims_won", "claims_lost",
            "skipped", "running_runs",
        )  # fmt: skip
        read_only_fields: tuple[str, ...] = fields

    def get_heartbeat_age_seconds(self, node: WorkerNode) -> float:
        now = self.context.get("now") or timezone.now()
        return round((now - node.last_heartbeat).total_seconds(), 3)

    def get_running_runs(self, node: WorkerNode) -> int:
        return cast("CountedNode", node).running_count or 0


# -- action input -------------------------------------------------------------------------------


def handler_for(name: str) -> Job:
    """Return the registered code that job ``name`` runs; UnknownJob when there is none."""
    stored = JobDefinition.objects.using(app_settings.DATABASE).filter(name=name)
    return registry.get(stored.values_list("callable_name", flat=True).first() or name)


class RunRequestSerializer(serializers.Serializer):
    """A payload for a run of the job named in the context: JSON its handler can take."""

    #: The arguments of validation.check_run_inputs, and the field each comes from.
    inputs = {"payload": "payload"}

    payload = serializers.DictField(required=False, default=dict)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        name = self.context["job"]
        try:
            handler = handler_for(name)
        except UnknownJob as exc:
            raise serializers.ValidationError({"job": str(exc)}) from exc
        given = {argument: attrs.get(field) for argument, field in self.inputs.items()}
        try:
            attrs["payload"] = check_run_inputs(name, handler=handler, **given)
        except ImproperlyDeclared as exc:  # InvalidPayload too
            field = self.inputs.get(exc.field, api_settings.NON_FIELD_ERRORS_KEY)
            raise serializers.ValidationError({field: str(exc)}) from exc
        return attrs


class EnqueueSerializer(RunRequestSerializer):
    """A one-off run: at ``run_at`` (default now); one run per ``idempotency_key``."""

    inputs = {"payload": "payload", "at": "run_at", "key": "idempotency_key",
              "priority": "priority"}  # fmt: skip

    run_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    idempotency_key = serializers.CharField(
        required=False, allow_null=True, default=None, max_length=KEY_MAX_LENGTH
    )
    priority = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=PRIORITY_MIN,
        max_value=PRIORITY_MAX,
        help_text="Larger runs sooner; the job's priority when left out.",
    )


class PauseSerializer(serializers.Serializer):
    """Pause until ``until`` (default: until resumed), with a reason shown to operators."""

    until = serializers.DateTimeField(required=False, allow_null=True, default=None)
    reason = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=PAUSE_REASON_MAX_LENGTH
    )

    def validate_until(self, until: datetime | None) -> datetime | None:
        if until is not None and until <= timezone.now():
            raise serializers.ValidationError("Pause until a time in the future.")
        return until

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        name = self.context["job"]
        try:
            check_run_inputs(name, at=attrs["until"])
        except ImproperlyDeclared as exc:
            raise serializers.ValidationError({"until": str(exc)}) from exc
        if problems := definition_errors({"pause_reason": attrs["reason"]}, job=name):
            raise serializers.ValidationError({"reason": str(problems[0])})
        return attrs


class InstanceFilterSerializer(serializers.Serializer):
    """The filter of the instance list: the root job's name."""

    job = serializers.CharField(required=False)

    def filter(self, runs: QuerySet) -> QuerySet:
        job = self.validated_data.get("job")
        return runs.filter(job__name=job) if job else runs


class RunFilterSerializer(serializers.Serializer):
    """The filters of the run list; ``state`` and ``outcome`` may repeat."""

    job = serializers.CharField(required=False)
    state = serializers.ListField(
        child=serializers.ChoiceField(choices=RunState.choices), required=False
    )
    outcome = serializers.ListField(
        child=serializers.ChoiceField(choices=Outcome.choices), required=False
    )
    node = serializers.CharField(required=False)
    since = serializers.DateTimeField(required=False)

    def filter(self, runs: QuerySet) -> QuerySet:
        """Return ``runs`` narrowed by the validated filters."""
        lookups = {
            "job": "job_id",
            "state": "state__in",
            "outcome": "outcome__in",
            "node": "node",
            "since": "scheduled_at__gte",
        }
        given = dict(self.validated_data)
        if "job" in given:
            # The job's id, not a join on its name: the (job, id) index then pages its runs.
            jobs = JobDefinition.objects.using(runs.db).filter(name=given["job"])
            given["job"] = jobs.values_list("pk", flat=True).first()
        return runs.filter(**{lookups[key]: value for key, value in given.items()})

"""The API's OpenAPI schema (drf-spectacular): refusals, answers, and the status report.

Every operation documents its refusals as well as its answer: 401 and 403 everywhere (which of
the two an unauthenticated caller gets depends on the project's authentication classes), 404
wherever the path names an object, and per view the 400, 409 and 415 it can answer.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from drf_spectacular.views import SpectacularAPIView
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated

from .. import __version__
from ..models import NodeStatus, RunState, ScheduleKind, Source


class ErrorSerializer(serializers.Serializer):
    """A refusal: what went wrong, in words."""

    detail = serializers.CharField()


class ValidationErrorSerializer(serializers.Serializer):
    """A refused input: each field at fault with its messages (``detail``: an unreadable body)."""


class ValidationErrorExtension(OpenApiSerializerExtension):
    """Describe REST framework's validation errors, whose keys are the fields at fault."""

    target_class = ValidationErrorSerializer

    def map_serializer(self, auto_schema: AutoSchema, direction: str) -> dict[str, Any]:
        messages = {"type": "array", "items": {"type": "string"}}
        nested = {"type": "object", "additionalProperties": {}}  # a list field's, by index
        return {
            "type": "object",
            "description": ValidationErrorSerializer.__doc__,
            "additionalProperties": {"oneOf": [{"type": "string"}, messages, nested]},
        }


class AnswerExtension(OpenApiSerializerExtension):
    """Mark only a receipt's fields as always present in an action's answer."""

    target_class = "django_cluster_jobs.api.answers.Answer"
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: str) -> dict[str, Any]:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["required"] = list(self.target.receipt)
        return schema


def refusal(description: str, serializer: type = ErrorSerializer) -> OpenApiResponse:
    return OpenApiResponse(serializer, description=description)


INVALID = refusal("The input is invalid (see the fields at fault).", ValidationErrorSerializer)
UNKNOWN = refusal("No such object.")
CONFLICT = refusal("The object is not in a state this action applies to.")
UNSUPPORTED = refusal("The body's media type is not JSON, a form or multipart.")
#: What every operation may answer.
COMMON = {
    401: refusal("Not authenticated, with an authentication scheme that asks for credentials."),
    403: refusal("Not authenticated, or without the permission this needs."),
}


def responses(
    answers: dict[int, Any], *, body: bool = False, query: bool = False, named: bool = True
) -> dict[int, Any]:
    """Return an operation's responses: ``answers``, then the refusals it can give.

    ``body``: it reads a request body; ``query``: it validates its query; ``named``: its path
    names an object.
    """
    refusals = {
        **({400: INVALID, 415: UNSUPPORTED} if body else {}),
        **({400: INVALID} if query else {}),
        **({404: UNKNOWN} if named else {}),
        **COMMON,
    }
    return {**answers, **{code: r for code, r in refusals.items() if code not in answers}}


@runtime_checkable
class QueryingView(Protocol):
    """A view that names what validates its query (every ClusterView)."""

    def get_query_serializer_class(self) -> type[serializers.Serializer] | None: ...


class ClusterSchema(AutoSchema):
    """Add a view's query parameters and refusals to each operation ``extend_schema`` left alone.

    Operations that ``extend_schema`` describes list their responses through :func:`responses`.
    """

    def _query(self) -> type | None:
        if not isinstance(self.view, QueryingView):  # a view that is not a ClusterView
            return None
        return self.view.get_query_serializer_class()

    def get_override_parameters(self) -> list:
        query = self._query()
        return [*super().get_override_parameters(), *([query] if query else [])]

    def get_response_serializers(self) -> Any:
        code = 201 if self._is_create_operation() else 200
        answer = super().get_response_serializers()
        return responses({code: answer}, query=bool(self._query()), named="{" in self.path)


def only_cluster_jobs(endpoints: list[tuple], **kwargs: Any) -> list[tuple]:
    """Keep this API's endpoints (a preprocessing hook of the schema view)."""
    return [e for e in endpoints if e[3].cls.__module__.startswith("django_cluster_jobs.api")]


def null_as_a_type(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Say 3.0's ``nullable`` the 3.1 way wherever it is left (REST framework's pagination).

    A postprocessing hook of the schema view, which serves OpenAPI 3.1.
    """
    stack: list[Any] = [result]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("type"), str) and node.pop("nullable", False):
                node["type"] = [node["type"], "null"]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return result


#: drf-spectacular settings of the schema this API serves; also for
#: ``manage.py spectacular --custom-settings django_cluster_jobs.api.schema.SCHEMA_SETTINGS``.
SCHEMA_SETTINGS = {
    # 3.1's null in a type union says what 3.0's "nullable" beside a $ref cannot.
    "OAS_VERSION": "3.1.0",
    "TITLE": "django-cluster-jobs",
    "DESCRIPTION": "The scheduler's jobs, runs, nodes and leader; operator actions.",
    "VERSION": __version__,
    "PREPROCESSING_HOOKS": [f"{__name__}.only_cluster_jobs"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        f"{__name__}.null_as_a_type",
    ],
}


class SchemaView(SpectacularAPIView):
    """This API's OpenAPI 3.1 schema, at the paths it is served on, for any signed-in user.

    YAML by default; JSON with ``?format=json`` or ``Accept: application/vnd.oai.openapi+json``.
    """

    permission_classes = (IsAuthenticated,)
    schema = None  # the schema does not describe itself
    custom_settings = SCHEMA_SETTINGS


# -- the leader and the status report -----------------------------------------------------------


class LeaderSerializer(serializers.Serializer):
    """The leader lease's holder, or all null when no node holds it."""

    holder = serializers.CharField(allow_null=True)
    since = serializers.DateTimeField(allow_null=True)
    fence = serializers.IntegerField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)


class StatusRunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    key = serializers.CharField()
    state = serializers.ChoiceField(choices=RunState.choices)
    scheduled_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    node = serializers.CharField(allow_blank=True)
    error = serializers.CharField(allow_blank=True, help_text="The error's first line.")


class StatusFailureSerializer(StatusRunSerializer):
    job = serializers.CharField()


class StatusScheduleSerializer(serializers.Serializer):
    # Values only: the job's own schedule_kind names ScheduleKind's choices with their labels.
    kind = serializers.ChoiceField(choices=[(kind, kind) for kind in ScheduleKind.values])
    cron = serializers.CharField(allow_null=True)
    timezone = serializers.CharField()
    interval_seconds = serializers.FloatField(allow_null=True)


class StatusJobSerializer(serializers.Serializer):
    name = serializers.CharField()
    callable = serializers.CharField()
    # The serializer's metaclass takes declared fields out of the class body, so this field does
    # not replace Field.source; the stubs cannot tell a declared field from that attribute.
    source = serializers.ChoiceField(choices=Source.choices)  # type: ignore[assignment]
    schedule = StatusScheduleSerializer()
    description = serializers.CharField()
    enabled = serializers.BooleanField()
    paused = serializers.BooleanField()
    paused_until = serializers.DateTimeField(allow_null=True)
    pause_reason = serializers.CharField(allow_blank=True)
    next_fire_time = serializers.DateTimeField(allow_null=True)
    last_run = StatusRunSerializer(allow_null=True)
    last_success = StatusRunSerializer(allow_null=True)
    last_failure = StatusRunSerializer(allow_null=True)
    problems = serializers.ListField(
        child=serializers.CharField(), help_text="Why no node plans the job; empty when usable."
    )


class StatusNodeSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    host = serializers.CharField(allow_blank=True)
    pid = serializers.IntegerField(allow_null=True)
    version = serializers.CharField(allow_blank=True)
    tags = serializers.ListField(child=serializers.CharField())
    status = serializers.ChoiceField(choices=NodeStatus.choices)
    started_at = serializers.DateTimeField()
    last_heartbeat = serializers.DateTimeField()
    heartbeat_age_seconds = serializers.FloatField()
    running_runs = serializers.IntegerField()
    clock_offset_ms = serializers.FloatField()
    claims_won = serializers.IntegerField()
    claims_lost = serializers.IntegerField()
    skipped = serializers.DictField(child=serializers.IntegerField(), help_text="By reason.")


class StatusUnreadableSerializer(serializers.Serializer):
    table = serializers.CharField()
    id = serializers.IntegerField()
    problems = serializers.ListField(child=serializers.CharField(), help_text="By column.")
    message = serializers.CharField(help_text="What the row is, why, and what to do.")


class StatusSerializer(serializers.Serializer):
    """The status report, as ``schedulerstatus --json`` prints it."""

    generated_at = serializers.DateTimeField()
    healthy = serializers.BooleanField()
    dead_after_seconds = serializers.FloatField()
    nodes = StatusNodeSerializer(many=True)
    leader = LeaderSerializer(allow_null=True)
    jobs = StatusJobSerializer(many=True)
    recent_failures = StatusFailureSerializer(many=True)
    unreadable = StatusUnreadableSerializer(
        many=True, help_text="Stored rows left out because a value in them cannot be read."
    )

"""The API's views: read the ledger, and act only through :mod:`django_cluster_jobs.services`.

Pagination, filtering and parsing are set here, not taken from the project's REST framework
settings: the run list pages by cursor (newest first, no COUNT over the ledger), the job and node
lists are short and come whole, and bodies are JSON (nested at most
:data:`~django_cluster_jobs.api.parsers.MAX_DEPTH` levels), forms or multipart. Authentication,
renderers and throttling are the project's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db.models import Count, Model, OuterRef, Subquery
from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound
from rest_framework.filters import BaseFilterBackend
from rest_framework.pagination import BasePagination
from rest_framework.parsers import BaseParser, FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.schemas.inspectors import ViewInspector
from rest_framework.views import APIView
from rest_framework.viewsets import ReadOnlyModelViewSet

from .. import services
from ..bounds import NAME_MAX_LENGTH
from ..columns import holds_a_name, holds_an_id
from ..conf import app_settings, ledger
from ..exceptions import ImproperlyDeclared, UnknownJob
from ..models import (
    LIVE_STATES,
    JobDefinition,
    JobRun,
    Lease,
    NodeStatus,
    RunState,
    WorkerNode,
)
from ..permissions import API, actor, can_view
from ..registry import registry
from ..status import build_status
from ..stored import collecting, tolerant
from ..workflows import instance_of, roots
from . import answers
from . import schema as doc
from . import serializers as api
from .pagination import RunCursorPagination
from .parsers import BoundedJSONParser
from .permissions import ClusterJobsPermission

if TYPE_CHECKING:
    from rest_framework.generics import BaseFilterProtocol
    from rest_framework.permissions import _PermissionClass

T = TypeVar("T")
M = TypeVar("M", bound=Model)


class Conflict(APIException):
    """The object is in a state the action does not apply to."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The object is not in a state this action applies to."
    default_code = "conflict"


#: The response header that names the rows a list left out because they cannot be read.
UNREADABLE_HEADER = "Cluster-Jobs-Unreadable"


def no_job(name: str) -> NotFound:
    return NotFound(f"No job named {name!r}.")


def addressable(part: str, value: str) -> bool:
    """Whether a path's ``value`` for ``part`` could name a row at all (a primary key, a name or
    a node id). Any other value names nothing: a 404, never a query the database or its driver
    refuses (a 500)."""
    return holds_an_id(value) if part == "pk" else holds_a_name(value)


class ClusterView(APIView):
    """What every view shares: permissions, parsers, no project-wide filters, the cluster clock."""

    permission_classes: Sequence[_PermissionClass] = (ClusterJobsPermission,)
    parser_classes: Sequence[type[BaseParser]] = (
        BoundedJSONParser,
        FormParser,
        MultiPartParser,
    )
    filter_backends: Sequence[type[BaseFilterBackend | BaseFilterProtocol[Any]]] = ()
    pagination_class: type[BasePagination] | None = None
    # drf-spectacular's schema whatever the project's DEFAULT_SCHEMA_CLASS; each action names
    # it too (schema=…), since extend_schema builds on the schema class it finds on the action.
    schema: ViewInspector | None = doc.ClusterSchema()
    viewed_models: tuple[type[Model], ...] = ()

    def initial(self, request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # The view's own lookup only (a project may mount the API under a prefix of its own),
        # and after the permissions: a stranger learns nothing.
        part = getattr(self, "lookup_url_kwarg", None) or getattr(self, "lookup_field", "")
        value = kwargs.get(part) if part else None
        if part and isinstance(value, str) and not addressable(part, value):
            raise NotFound(f"No object has the {part} {value[:NAME_MAX_LENGTH]!r}.")

    def check_permissions(self, request) -> None:
        # A method no handler takes is 405 for everyone, before a permission could say 403.
        method = request.method.lower()
        if method not in self.http_method_names or not hasattr(self, method):
            self.http_method_not_allowed(request)
        super().check_permissions(request)

    def cluster_now(self) -> datetime:
        """Return the database's time (cluster time), once per request."""
        if not hasattr(self, "_now"):
            self._now = services.cluster_now()
        return self._now

    def get_query_serializer_class(self) -> type[serializers.Serializer] | None:
        """Return what validates this request's query (the schema lists its fields)."""
        return None

    def query(self) -> Any:
        """Return the query, validated by :meth:`get_query_serializer_class` (400 otherwise)."""
        serializer_class = self.get_query_serializer_class()
        if serializer_class is None:
            raise TypeError(f"{type(self).__name__} validates no query")
        given = serializer_class(data=self.request.query_params)
        given.is_valid(raise_exception=True)
        return given


class ClusterViewSet(ClusterView, ReadOnlyModelViewSet):
    """What the viewsets share besides: the cluster clock in the serializer's context, answers.

    A stored row that cannot be read (see :mod:`django_cluster_jobs.stored`) is left out of a
    list, which names it in its ``Cluster-Jobs-Unreadable`` header (``table id``, comma
    separated); asked for by itself, it is a 409 that says why.
    """

    def dispatch(self, request, *args: Any, **kwargs: Any):
        with collecting() as unreadable:
            response = super().dispatch(request, *args, **kwargs)
        if unreadable:
            response[UNREADABLE_HEADER] = ", ".join(f"{row.table} {row.pk}" for row in unreadable)
        return response

    def filter_queryset(self, queryset):
        return tolerant(super().filter_queryset(queryset))

    def get_object(self) -> Any:
        with collecting() as unreadable:
            try:
                return super().get_object()
            except Http404 as exc:
                if unreadable:
                    raise Conflict(str(unreadable[0]), code="unreadable_row") from exc
                raise

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "now": self.cluster_now()}

    def answer(
        self, serializer_class: type[serializers.ModelSerializer], instance: Model, code: int
    ) -> Response:
        """Answer an action with ``instance``: whole if the caller may view it, else a receipt."""
        full = can_view(self.request.user, serializer_class.Meta.model)
        context = {**self.get_serializer_context(), "full": full}
        return Response(serializer_class(instance, context=context).data, status=code)

    def answer_run(self, run: JobRun, code: int) -> Response:
        fresh = ledger(JobRun).select_related("job").prefetch_related("events", "logs")
        fresh = fresh.get(pk=run.pk)
        return self.answer(answers.RunAnswerSerializer, fresh, code)


RUN_MADE = answers.RunAnswerSerializer
JOB_CHANGED = answers.JobAnswerSerializer
NODE_ASKED = answers.NodeAnswerSerializer


class JobViewSet(ClusterViewSet):
    """Jobs by name, with their schedule, pause, next fire times and last runs; and actions."""

    viewed_models = (JobDefinition,)
    lookup_field = "name"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        return ledger(JobDefinition).with_last_runs(self.cluster_now()).order_by("name")

    def get_serializer_class(self):
        return api.JobSerializer if self.action == "list" else api.JobDetailSerializer

    def get_object(self) -> JobDefinition:
        try:
            return super().get_object()
        except Http404 as exc:
            raise no_job(self.kwargs["name"]) from exc

    def _known(self, name: str) -> None:
        """Refuse a name that is neither stored nor registered in code (404)."""
        if name not in registry and not ledger(JobDefinition).filter(name=name).exists():
            raise no_job(name)

    def _input(self, serializer_class, name: str) -> dict[str, Any]:
        self._known(name)
        context = {**self.get_serializer_context(), "job": name}
        given = serializer_class(data=self.request.data, context=context)
        given.is_valid(raise_exception=True)
        return given.validated_data

    def _make_run(self, make: Callable[[], T]) -> T:
        """Return what ``make`` makes, its refusals as the API's."""
        try:
            return make()
        except UnknownJob as exc:  # gone since _known looked
            raise NotFound(str(exc)) from exc
        except ImproperlyDeclared as exc:  # InvalidPayload too: the field is "payload"
            raise serializers.ValidationError({exc.field: str(exc)}) from exc

    def _job_answer(self, name: str) -> Response:
        return self.answer(JOB_CHANGED, self.get_object(), status.HTTP_200_OK)

    @extend_schema(
        request=api.RunRequestSerializer, responses=doc.responses({201: RUN_MADE}, body=True)
    )
    @action(detail=True, methods=["post"], schema=doc.ClusterSchema)
    def trigger(self, request, name: str) -> Response:
        """Run the job now, outside its schedule; returns the pending run."""
        payload = self._input(api.RunRequestSerializer, name)["payload"]
        by = actor(request, API)
        run = self._make_run(lambda: services.trigger(name, payload, by=by))
        return self.answer_run(run, status.HTTP_201_CREATED)

    @extend_schema(
        request=api.EnqueueSerializer,
        responses=doc.responses({200: RUN_MADE, 201: RUN_MADE}, body=True),
    )
    @action(detail=True, methods=["post"], schema=doc.ClusterSchema)
    def enqueue(self, request, name: str) -> Response:
        """Queue a one-off run (201); a repeated ``idempotency_key`` returns the first run (200)."""
        given = self._input(api.EnqueueSerializer, name)
        run, created = self._make_run(
            lambda: services.get_or_enqueue(
                name,
                given["payload"],
                at=given["run_at"],
                key=given["idempotency_key"],
                priority=given["priority"],
                by=actor(request, API),
            )
        )
        return self.answer_run(run, status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        request=api.PauseSerializer, responses=doc.responses({200: JOB_CHANGED}, body=True)
    )
    @action(detail=True, methods=["post"], schema=doc.ClusterSchema)
    def pause(self, request, name: str) -> Response:
        """Stop firing the job until ``until`` or until resumed."""
        given = self._input(api.PauseSerializer, name)
        by = actor(request, API)
        if not services.pause(name, until=given["until"], reason=given["reason"], by=by):
            raise no_job(name)
        return self._job_answer(name)

    @extend_schema(request=None, responses=doc.responses({200: JOB_CHANGED}))
    @action(detail=True, methods=["post"], schema=doc.ClusterSchema)
    def resume(self, request, name: str) -> Response:
        """Resume a paused job (also one its circuit breaker paused) at once."""
        if not services.resume(name, by=actor(request, API)):
            raise no_job(name)
        return self._job_answer(name)


class RunViewSet(ClusterViewSet):
    """The run ledger, newest first, with each run's timeline and log; cancel and replay runs.

    Filters: ``job`` (name), ``state`` and ``outcome`` (repeatable), ``node``, ``since``.
    """

    viewed_models = (JobRun,)
    pagination_class = RunCursorPagination
    lookup_value_regex = r"\d+"

    def get_query_serializer_class(self) -> type[serializers.Serializer] | None:
        return api.RunFilterSerializer if self.action == "list" else None

    def get_queryset(self):
        runs = ledger(JobRun).select_related("job")
        if self.action == "list":
            return self.query().filter(runs)
        return runs.prefetch_related("events", "logs") if self.action == "retrieve" else runs

    def get_serializer_class(self):
        return api.RunSerializer if self.action == "list" else api.RunDetailSerializer

    @extend_schema(request=None, responses=doc.responses({202: RUN_MADE, 409: doc.CONFLICT}))
    @action(detail=True, methods=["post"], schema=doc.ClusterSchema)
    def cancel(self, request, pk: str) -> Response:
        """Ask the node running this run to stop it at its next heartbeat."""
        run = self.get_object()
        if not services.request_cancel(run, by=actor(request, API)):
            raise Conflict(f"Only running runs can be cancelled; run {run.pk} is {run.state}.")
        return self.answer_run(run, status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses=doc.responses({201: RUN_MADE, 409: doc.CONFLICT}))
    @action(detail=True, methods=["post"], schema=doc.ClusterSchema)
    def replay(self, request, pk: str) -> Response:
        """Run a finished run again, as a fresh pending run linked to it."""
        run = self.get_object()
        if run.state in LIVE_STATES:
            raise Conflict(f"Only finished runs can be replayed; run {run.pk} is {run.state}.")
        try:
            fresh = services.replay(run, by=actor(request, API))
        except ImproperlyDeclared as exc:  # a stored run the engine cannot take again
            raise serializers.ValidationError({exc.field: str(exc)}) from exc
        return self.answer_run(fresh, 201)


class InstanceViewSet(ClusterViewSet):
    """Workflow instances, newest first: each started by a root job's run, with its steps.

    Filter: ``job`` (the root job's name).
    """

    viewed_models = (JobRun,)
    pagination_class = RunCursorPagination
    lookup_value_regex = r"\d+"

    def get_query_serializer_class(self) -> type[serializers.Serializer] | None:
        return api.InstanceFilterSerializer if self.action == "list" else None

    def get_queryset(self):
        runs = roots(ledger(JobRun).select_related("job"), ledger(JobDefinition))
        return self.query().filter(runs) if self.action == "list" else runs

    def get_serializer_class(self):
        return api.InstanceSerializer if self.action == "list" else api.InstanceDetailSerializer

    def retrieve(self, request, *args, **kwargs) -> Response:
        """The instance, its state and each job's step; any run of the instance names it."""
        instance = instance_of(app_settings.DATABASE, int(kwargs["pk"]))
        if instance is None:
            raise NotFound(f"Run {kwargs['pk']} belongs to no workflow instance.")
        return Response(self.get_serializer(instance).data)


class NodeViewSet(ClusterViewSet):
    """Scheduler nodes with their heartbeat and running runs; drain one."""

    viewed_models = (WorkerNode,)
    serializer_class = api.NodeSerializer
    lookup_field = "node_id"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        running = JobRun.objects.filter(node=OuterRef("node_id"), state=RunState.RUNNING)
        count = running.order_by().values("node").annotate(n=Count("pk")).values("n")[:1]
        return ledger(WorkerNode).annotate(running_count=Subquery(count)).order_by("node_id")

    @extend_schema(request=None, responses=doc.responses({202: NODE_ASKED, 409: doc.CONFLICT}))
    @action(detail=True, methods=["post"], schema=doc.ClusterSchema)
    def drain(self, request, node_id: str) -> Response:
        """Ask an active node to drain: stop claiming, finish its runs, stop."""
        node = self.get_object()
        asked = node.status == NodeStatus.ACTIVE and services.request_drain(
            [node.node_id], by=actor(request, API)
        )
        if not asked:
            raise Conflict(f"Only active nodes can be drained; {node.node_id} is {node.status}.")
        fresh = self.get_queryset().get(pk=node.pk)
        return self.answer(answers.NodeAnswerSerializer, fresh, status.HTTP_202_ACCEPTED)


@extend_schema(responses=doc.responses({200: doc.LeaderSerializer}, named=False))
class LeaderView(ClusterView, APIView):
    """The node holding the leader lease (on the database's clock); all null when none does."""

    viewed_models = (Lease,)

    def get(self, request) -> Response:
        lease = tolerant(ledger(Lease).leader()).first()
        held = {
            "holder": lease.holder if lease else None,
            "since": lease.acquired_at if lease else None,
            "fence": lease.fence if lease else None,
            "expires_at": lease.expires_at if lease else None,
        }
        return Response(doc.LeaderSerializer(held).data)


class StatusQuerySerializer(serializers.Serializer):
    failures = serializers.IntegerField(required=False, default=10, min_value=0, max_value=1000)


@extend_schema(responses=doc.responses({200: doc.StatusSerializer}, query=True, named=False))
class StatusView(ClusterView, APIView):
    """The scheduler status report, exactly as ``schedulerstatus --json`` prints it."""

    viewed_models = (JobDefinition, JobRun, WorkerNode, Lease)

    def get_query_serializer_class(self) -> type[serializers.Serializer]:
        return StatusQuerySerializer

    def get(self, request) -> Response:
        return Response(build_status(failures=self.query().validated_data["failures"]))

"""The API's views: read the ledger, and act only through :mod:`django_cluster_jobs.services`.

Pagination and filtering are set here, not taken from the project's REST framework settings:
the run list pages by cursor (newest first, no COUNT over the ledger), the job and node lists are
short and come whole. Authentication, renderers and throttling are the project's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Now
from django.utils import timezone
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.viewsets import ReadOnlyModelViewSet

from .. import services
from ..conf import app_settings
from ..coordination import get_coordinator
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
from ..status import LEADER, build_status
from . import serializers as api
from .permissions import ClusterJobsPermission


class Conflict(APIException):
    """The object is in a state the action does not apply to."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The object is not in a state this action applies to."
    default_code = "conflict"


class RunCursorPagination(CursorPagination):
    """Newest runs first by id: unique and unchanging, so pages hold still while runs arrive."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


def actor(request) -> str:
    """Return who acts, as recorded in the ledger (``triggered by …``, event ``node``)."""
    return f"api:{request.user.get_username()}"


def ledger(model):
    """Return a plain queryset of ``model`` on the ledger database."""
    return model.objects.using(app_settings.DATABASE)


def run_response(run: JobRun, code: int) -> Response:
    """Return ``run`` as its detail page shows it."""
    fresh = ledger(JobRun).select_related("job").prefetch_related("events").get(pk=run.pk)
    return Response(api.RunDetailSerializer(fresh).data, status=code)


class ClusterView:
    """What every view shares: the permission model, no project-wide filters, the cluster clock."""

    permission_classes = (ClusterJobsPermission,)
    filter_backends = ()
    pagination_class = None
    viewed_models: tuple = ()

    def cluster_now(self) -> datetime:
        """Return the database's time (cluster time), once per request."""
        if not hasattr(self, "_now"):
            self._now = get_coordinator(app_settings.DATABASE).db_now() or timezone.now()
        return self._now

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "now": self.cluster_now()}


class JobViewSet(ClusterView, ReadOnlyModelViewSet):
    """Jobs by name, with their schedule, pause, next fire times and last runs; and actions."""

    viewed_models = (JobDefinition,)
    lookup_field = "name"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        return api.annotate_last_runs(ledger(JobDefinition), self.cluster_now()).order_by("name")

    def get_serializer_class(self):
        return api.JobSerializer if self.action == "list" else api.JobDetailSerializer

    def _input(self, serializer_class, name: str) -> dict[str, Any]:
        context = {**self.get_serializer_context(), "job": name}
        given = serializer_class(data=self.request.data, context=context)
        given.is_valid(raise_exception=True)
        return given.validated_data

    def _run_created(self, call, *args: Any, **kwargs: Any) -> Response:
        try:
            run = call(*args, **kwargs)
        except UnknownJob as exc:
            raise serializers.ValidationError({"job": str(exc)}) from exc
        except ImproperlyDeclared as exc:  # InvalidPayload too: the field is "payload"
            raise serializers.ValidationError({exc.field: str(exc)}) from exc
        return run_response(run, status.HTTP_201_CREATED)

    def _job_response(self, name: str) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(name=name)).data)

    @action(detail=True, methods=["post"])
    def trigger(self, request, name: str) -> Response:
        """Run the job now, outside its schedule; returns the pending run."""
        given = self._input(api.RunRequestSerializer, name)
        return self._run_created(services.trigger, name, given["payload"], by=actor(request))

    @action(detail=True, methods=["post"])
    def enqueue(self, request, name: str) -> Response:
        """Queue a one-off run; a repeated ``idempotency_key`` returns the first run."""
        given = self._input(api.EnqueueSerializer, name)
        return self._run_created(
            services.enqueue,
            name,
            given["payload"],
            at=given["run_at"],
            key=given["idempotency_key"],
            priority=given["priority"],
        )

    @action(detail=True, methods=["post"])
    def pause(self, request, name: str) -> Response:
        """Stop firing the job until ``until`` or until resumed."""
        given = self._input(api.PauseSerializer, name)
        reason = given["reason"] or f"paused by {actor(request)}"
        if not services.pause(name, until=given["until"], reason=reason):
            raise NotFound(f"No job named {name!r}.")
        return self._job_response(name)

    @action(detail=True, methods=["post"])
    def resume(self, request, name: str) -> Response:
        """Resume a paused job (also one its circuit breaker paused) at once."""
        if not services.resume(name):
            raise NotFound(f"No job named {name!r}.")
        return self._job_response(name)


class RunViewSet(ClusterView, ReadOnlyModelViewSet):
    """The run ledger, newest first, with each run's timeline; cancel and replay runs.

    Filters: ``job`` (name), ``state`` and ``outcome`` (repeatable), ``node``, ``since``.
    """

    viewed_models = (JobRun,)
    pagination_class = RunCursorPagination
    lookup_value_regex = r"\d+"

    def get_queryset(self):
        runs = ledger(JobRun).select_related("job")
        if self.action == "list":
            filters = api.RunFilterSerializer(data=self.request.query_params)
            filters.is_valid(raise_exception=True)
            return filters.filter(runs)
        return runs.prefetch_related("events") if self.action == "retrieve" else runs

    def get_serializer_class(self):
        return api.RunSerializer if self.action == "list" else api.RunDetailSerializer

    @action(detail=True, methods=["post"])
    def cancel(self, request, pk: str) -> Response:
        """Ask the node running this run to stop it at its next heartbeat."""
        run = self.get_object()
        if not services.request_cancel(run, by=actor(request)):
            raise Conflict(f"Only running runs can be cancelled; run {run.pk} is {run.state}.")
        return run_response(run, status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["post"])
    def replay(self, request, pk: str) -> Response:
        """Run a finished run again, as a fresh pending run linked to it."""
        run = self.get_object()
        if run.state in LIVE_STATES:
            raise Conflict(f"Only finished runs can be replayed; run {run.pk} is {run.state}.")
        try:
            fresh = services.replay(run, by=actor(request))
        except ImproperlyDeclared as exc:  # a stored run the engine cannot take again
            raise serializers.ValidationError({exc.field: str(exc)}) from exc
        return run_response(fresh, status.HTTP_201_CREATED)


class NodeViewSet(ClusterView, ReadOnlyModelViewSet):
    """Scheduler nodes with their heartbeat and running runs; drain one."""

    viewed_models = (WorkerNode,)
    serializer_class = api.NodeSerializer
    lookup_field = "node_id"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        running = JobRun.objects.filter(node=OuterRef("node_id"), state=RunState.RUNNING)
        count = running.order_by().values("node").annotate(n=Count("pk")).values("n")[:1]
        return ledger(WorkerNode).annotate(running_count=Subquery(count)).order_by("node_id")

    @action(detail=True, methods=["post"])
    def drain(self, request, node_id: str) -> Response:
        """Ask an active node to drain: stop claiming, finish its runs, stop."""
        node = self.get_object()
        if node.status != NodeStatus.ACTIVE or not services.request_drain([node.node_id]):
            raise Conflict(f"Only active nodes can be drained; {node.node_id} is {node.status}.")
        fresh = self.get_queryset().get(pk=node.pk)
        return Response(self.get_serializer(fresh).data, status=status.HTTP_202_ACCEPTED)


class LeaderView(ClusterView, APIView):
    """The node holding the leader lease (on the database's clock); all null when none does."""

    viewed_models = (Lease,)

    def get(self, request) -> Response:
        lease = ledger(Lease).filter(name=LEADER, expires_at__gt=Now()).exclude(holder="").first()
        return Response(
            {
                "holder": lease.holder if lease else None,
                "since": api.iso(lease.acquired_at) if lease else None,
                "fence": lease.fence if lease else None,
                "expires_at": api.iso(lease.expires_at) if lease else None,
            }
        )


class StatusQuerySerializer(serializers.Serializer):
    failures = serializers.IntegerField(required=False, default=10, min_value=0, max_value=1000)


class StatusView(ClusterView, APIView):
    """The scheduler status report, exactly as ``schedulerstatus --json`` prints it."""

    viewed_models = (JobDefinition, JobRun, WorkerNode, Lease)

    def get(self, request) -> Response:
        query = StatusQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(build_status(failures=query.validated_data["failures"]))

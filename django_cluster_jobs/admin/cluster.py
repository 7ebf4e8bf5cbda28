"""The cluster in the console: nodes with their health and the leader, leases, cluster events."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import (
    BooleanField,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Subquery,
)
from django.db.models.functions import Now
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from .. import services
from ..conf import ledger
from ..models import ClusterEvent, JobRun, Lease, NodeStatus, RunState, WorkerNode
from ..permissions import ADMIN, actor
from ..stored import tolerant
from ..wording import interval_text
from .base import LedgerDatabaseMixin, OperatorActionsMixin, ReadOnlyMixin
from .overview import occurrence_view, overview_view
from .runs import NodeFilter
from .text import time_column, when


def current_leader() -> Lease | None:
    """Return the leader lease while some node holds it (one query), else None."""
    return tolerant(ledger(Lease).leader()).first()


@admin.register(WorkerNode)
class WorkerNodeAdmin(OperatorActionsMixin, ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    # What an operator scans for at 1366 px (beside the admin's navigation and the filters); the
    # host (in the default node id), pid, version, start and claims are on the node's page.
    list_display = (
        "node_id", "leader", "status", "heartbeat_age", "running_runs", "skips", "clock_offset",
    )  # fmt: skip
    list_filter = ("status",)
    search_fields = ("node_id", "host")
    actions = ("drain",)
    object_actions = (("drain", gettext_lazy("Drain")),)
    fields = (
        "node_id", "leader", "host", "pid", "version", "tags", "status", "started",
        "last_heartbeat_at", "heartbeat_age", "stopped", "clock_offset_ms", "claims_won",
        "claims_lost", "skips", "running_runs",
    )  # fmt: skip
    readonly_fields = (
        "leader", "started", "last_heartbeat_at", "heartbeat_age", "stopped", "skips",
        "running_runs",
    )  # fmt: skip
    started = time_column(WorkerNode, "started_at")
    last_heartbeat_at = time_column(WorkerNode, "last_heartbeat")
    stopped = time_column(WorkerNode, "stopped_at")

    def get_queryset(self, request):
        running = JobRun.objects.filter(node=OuterRef("node_id"), state=RunState.RUNNING)
        count = running.order_by().values("node").annotate(n=Count("pk")).values("n")[:1]
        lease = Lease.objects.leader().filter(holder=OuterRef("node_id"))
        # Heartbeats are stamped on the database's clock, so their age is measured there too.
        age = ExpressionWrapper(Now() - F("last_heartbeat"), output_field=DurationField())
        return (
            super()
            .get_queryset(request)
            .annotate(
                running_count=Subquery(count),
                heartbeat_age_value=age,
                leader_fence=Subquery(lease.values("fence")[:1]),
                leader_since=Subquery(lease.values("acquired_at")[:1]),
            )
        )

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("overview/", wrap(lambda request: overview_view(self, request)),
                 name="cluster_jobs_overview"),
            path("occurrence/", wrap(lambda request: occurrence_view(self, request)),
                 name="cluster_jobs_occurrence"),
            *super().get_urls(),
        ]  # fmt: skip

    def changelist_view(self, request, extra_context=None):
        lease = current_leader()
        leader = lease and {
            "holder": lease.holder,
            "fence": lease.fence,
            "since": when(lease.acquired_at),
            "until": when(lease.expires_at),
        }
        extra_context = {**(extra_context or {}), "leader": leader}
        return super().changelist_view(request, extra_context)

    def object_action_applies(self, name, obj):
        return obj.status == NodeStatus.ACTIVE

    @admin.action(description=gettext_lazy("Drain selected nodes"), permissions=["manage"])
    def drain(self, request, queryset):
        nodes = list(ledger(WorkerNode).filter(pk__in=list(queryset.values_list("pk", flat=True))))
        active = [node for node in nodes if node.status == NodeStatus.ACTIVE]
        drained = services.request_drain(
            [node.node_id for node in active], by=actor(request, ADMIN)
        )
        changed = [(node, "Drain requested.") for node in active]
        text = ngettext(
            "%(n)d node will drain at its next heartbeat.",
            "%(n)d nodes will drain at their next heartbeat.",
            drained,
        ) % {"n": drained}
        self.report(request, changed, text, done=bool(drained))

    # -- columns

    @admin.display(description=gettext_lazy("leader"), ordering="leader_fence")
    def leader(self, obj):
        if obj.leader_fence is None:
            return ""
        text = _("leader since %(since)s, fence %(fence)s")
        return format_html(
            '<strong class="cluster-jobs-leader">{}</strong>',
            text % {"since": when(obj.leader_since), "fence": obj.leader_fence},
        )

    @admin.display(description=gettext_lazy("heartbeat age"), ordering="heartbeat_age_value")
    def heartbeat_age(self, obj):
        seconds = int(obj.heartbeat_age_value.total_seconds())
        return interval_text(timedelta(seconds=seconds)) if seconds > 0 else _("< 1 s")

    @admin.display(description=gettext_lazy("clock offset (ms)"), ordering="clock_offset_ms")
    def clock_offset(self, obj):
        return f"{obj.clock_offset_ms:+.1f}"

    @admin.display(description=gettext_lazy("skipped"))
    def skips(self, obj):
        return ", ".join(f"{reason}: {n}" for reason, n in sorted(obj.skipped.items())) or "-"

    @admin.display(description=gettext_lazy("running runs"), ordering="running_count")
    def running_runs(self, obj):
        count = obj.running_count or 0
        url = reverse(f"{self.admin_site.name}:cluster_jobs_jobrun_changelist")
        query = urlencode({"node": obj.node_id, "state__exact": RunState.RUNNING})
        return format_html('<a href="{}?{}">{}</a>', url, query, count)


@admin.register(Lease)
class LeaseAdmin(ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    list_display = ("name", "holder", "fence", "acquired", "expires", "held")
    search_fields = ("name", "holder")
    fields = ("name", "holder", "fence", "acquired", "expires", "held")
    readonly_fields = ("acquired", "expires", "held")
    acquired = time_column(Lease, "acquired_at")
    expires = time_column(Lease, "expires_at")

    def get_queryset(self, request):
        # Leases run on the database's clock, so "held" is decided there too.
        held = ExpressionWrapper(Q(expires_at__gt=Now()), output_field=BooleanField())
        return super().get_queryset(request).annotate(is_held=held)

    @admin.display(description=gettext_lazy("held"), boolean=True, ordering="is_held")
    def held(self, obj):
        return bool(obj.is_held)


@admin.register(ClusterEvent)
class ClusterEventAdmin(ReadOnlyMixin, LedgerDatabaseMixin, admin.ModelAdmin):
    """What happened to the cluster: leadership changes, dead nodes, reaping, purges."""

    list_display = ("time", "kind", "node", "fence", "detail")
    list_filter = ("kind", NodeFilter)
    search_fields = ("node", "detail")
    date_hierarchy = "at"
    fields = ("time", "kind", "node", "fence", "detail")
    readonly_fields = ("time",)
    time = time_column(ClusterEvent, "at")
    show_full_result_count = False

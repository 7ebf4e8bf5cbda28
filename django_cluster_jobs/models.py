"""The ledger: job definitions, runs (claims + history), run events, worker nodes and leases."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db import models
from django.db.models import Case, F, OuterRef, Q, Subquery, When
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from . import schedules
from .choices import (
    Delivery,
    Misfire,
    Outcome,
    Overlap,
    PauseCause,
    Placement,
    ScheduleKind,
    Source,
)
from .exceptions import ClusterJobsError
from .indexes import CoveringIndex
from .stored import UNREADABLE, TolerantDecoder


class JobDefinitionQuerySet(models.QuerySet):
    def breaker_open(self, now: datetime) -> JobDefinitionQuerySet:
        """Jobs their circuit breaker holds paused at ``now``."""
        return self.filter(pause_cause=PauseCause.BREAKER, paused_until__gt=now)

    def predecessors(self) -> dict[str, list[str]]:
        """Each stored job that waits for others, by name, with its predecessors' names."""
        rows = self.values_list("name", "after")
        return {name: list(after) for name, after in rows if isinstance(after, list) and after}

    def dependents_of(self, name: str) -> JobDefinitionQuerySet:
        """The jobs that name ``name`` among their predecessors (read from the small table of
        definitions, the way every database can: JSON containment is not portable)."""
        names = [job for job, after in self.predecessors().items() if name in after]
        return self.filter(name__in=names)

    def with_last_runs(self, now: datetime) -> JobDefinitionQuerySet:
        """Annotate the ids of each job's last run by ``now``, last success and last failure."""
        runs = JobRun.objects.filter(job_id=OuterRef("pk"))
        return self.annotate(
            last_run_id=runs.scheduled_by(now).newest_first().pks(),
            last_success_id=runs.succeeded().newest_first().pks(),
            last_failure_id=runs.failures().newest_first().pks(),
        )


class JobDefinition(models.Model):
    """A job: declared in code (upserted at scheduler start) or in the database (admin)."""

    name = models.CharField(max_length=200, unique=True)
    callable_name = models.CharField(
        max_length=200, help_text=_("Name of the registered job whose code runs.")
    )
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.DATABASE)
    schedule_kind = models.CharField(
        max_length=10, choices=ScheduleKind.choices, default=ScheduleKind.ON_DEMAND
    )
    cron = models.CharField(max_length=200, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    interval = models.DurationField(null=True, blank=True)
    placement = models.CharField(
        max_length=12, choices=Placement.choices, default=Placement.CLUSTER
    )
    delivery = models.CharField(
        max_length=14, choices=Delivery.choices, default=Delivery.AT_LEAST_ONCE
    )
    overlap = models.CharField(max_length=12, choices=Overlap.choices, default=Overlap.SKIP)
    misfire = models.CharField(max_length=10, choices=Misfire.choices, default=Misfire.FIRE_ONCE)
    catch_up_window = models.DurationField(null=True, blank=True)
    catch_up_limit = models.PositiveIntegerField(
        default=10, help_text=_("Most missed occurrences run by the run_all misfire policy.")
    )
    max_attempts = models.PositiveIntegerField(default=1)
    backoff = models.JSONField(default=dict, blank=True, decoder=TolerantDecoder)
    breaker_threshold = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Consecutive failed runs that pause the job.")
    )
    breaker_cooldown = models.DurationField(null=True, blank=True)
    executor = models.CharField(
        max_length=10, default="thread", help_text=_("thread, or process for a hard timeout.")
    )
    timeout = models.DurationField(null=True, blank=True)
    priority = models.IntegerField(default=0)
    queue = models.CharField(max_length=100, default="default")
    max_concurrency = models.PositiveIntegerField(null=True, blank=True)
    requires = models.JSONField(default=list, blank=True, decoder=TolerantDecoder)
    after = models.JSONField(
        default=list,
        blank=True,
        decoder=TolerantDecoder,
        help_text=_(
            "Names of the jobs that must succeed first, within one workflow instance; the job "
            "then runs on demand only (its predecessors' successes queue it)."
        ),
    )
    payload = models.JSONField(default=dict, blank=True, decoder=TolerantDecoder)
    enabled = models.BooleanField(default=True)
    paused_until = models.DateTimeField(null=True, blank=True)
    pause_reason = models.CharField(max_length=200, blank=True)
    pause_cause = models.CharField(
        max_length=10,
        choices=PauseCause.choices,
        blank=True,
        default=PauseCause.NONE,
        editable=False,
        help_text=_("Who paused the job (the reason says it in words)."),
    )
    settled_through = models.DateTimeField(
        editable=False,
        help_text=_(
            "Cluster time up to which every occurrence is decided (claimed, recorded missed, or "
            "not due); claims of occurrences at or before it are refused."
        ),
    )
    revision = models.PositiveIntegerField(
        default=0,
        editable=False,
        help_text=_(
            "Bumped by every change of what is due; claims planned from an older revision are "
            "refused, so occurrences after a change follow the new definition only."
        ),
    )
    next_to_settle = models.DateTimeField(
        null=True,
        editable=False,
        db_index=True,
        help_text=_(
            "The first occurrence after settled_through that the leader may have to settle "
            "(9999-12-31: none); the leader's catch-up reads only the jobs it has reached. "
            "Empty until computed."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = JobDefinitionQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = _("job")
        permissions = [
            ("trigger_jobdefinition", _("Can trigger runs of jobs")),
            (
                "manage_jobdefinition",
                _("Can pause, resume, enable, disable and cancel jobs, and drain nodes"),
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs) -> None:
        """Save; a new job, or a change of what is due, also moves ``settled_through``.

        A change settles the job's occurrences up to now under the definition as stored, then
        moves the mark to now, in one transaction (see ``ledger.changes``): occurrences before
        a change follow the old definition, later ones the new.
        """
        from .ledger.changes import save_definition

        save_definition(self, super().save, *args, **kwargs)

    def is_paused_at(self, now: datetime) -> bool:
        """Whether a pause holds the job at ``now``."""
        return self.paused_until is not None and self.paused_until > now

    def default_payload(self) -> dict:
        """A copy of the job's payload, as each of its runs starts with; {} when it has none."""
        return dict(self.payload) if isinstance(self.payload, dict) else {}

    def fire_times(self, now: datetime, count: int) -> list[datetime]:
        """The next ``count`` slots the job fires at (after its pause); none when disabled."""
        return self.upcoming(now, count) if self.enabled else []

    def get_schedule(self) -> schedules.Schedule:
        """Return this definition's schedule object."""
        return schedules.from_fields(self.schedule_kind, self.cron, self.timezone, self.interval)

    def upcoming(self, now: datetime, count: int) -> list[datetime]:
        """Return the next ``count`` slots it will fire at (after a pause ends), ignoring
        ``enabled``; none when its schedule has no slots, is invalid, or it is paused with no
        end."""
        start = max(now, self.paused_until) if self.paused_until else now
        if start.year >= 9999:  # paused until resumed
            return []
        try:
            schedule = self.get_schedule()
            return schedule.upcoming(start, count) if schedule.slotted else []
        except (ClusterJobsError, ValueError, OverflowError):
            return []


class RunState(models.TextChoices):
    PENDING = "pending", _("pending")
    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    TIMED_OUT = "timed_out", _("timed out")
    CANCELLED = "cancelled", _("cancelled")
    LOST = "lost", _("lost")
    SKIPPED = "skipped", _("skipped")
    MISSED = "missed", _("missed")
    DEAD = "dead", _("dead-lettered")


LIVE_STATES = (RunState.PENDING, RunState.RUNNING)
#: The ends of a run that did not succeed: what "last failure" and "recent failures" count.
FAILURE_STATES = (RunState.FAILED, RunState.TIMED_OUT, RunState.LOST, RunState.DEAD)
#: ``due_at`` of a buffered run (overlap ``buffer_one``) until the live one ends.
PARKED = datetime(9999, 12, 31, tzinfo=UTC)


class Cause(models.TextChoices):
    """Why a run is pending again: a code the take reads back, never parsed from the reason."""

    FIRST = "", _("first attempt")
    RETRY = "retry", _("retry after a failed attempt")
    LEASE_EXPIRED = "lease_expired", _("its node's lease expired")
    HANDED_BACK = "handed_back", _("handed back by a stopping node")
    NODE_LOST = "node_lost", _("its node's process ended")
    BUFFERED = "buffered", _("buffered behind a live run")
    UPSTREAM = "upstream", _("a predecessor ended without success")


class JobRunQuerySet(models.QuerySet):
    def scheduled_by(self, now: datetime) -> JobRunQuerySet:
        """Runs whose occurrence is at or before ``now`` (a job's "last run" is among these)."""
        return self.filter(scheduled_at__lte=now)

    def succeeded(self) -> JobRunQuerySet:
        return self.filter(state=RunState.SUCCEEDED)

    def failures(self) -> JobRunQuerySet:
        """Runs that ended failed, timed out, lost or dead-lettered (:data:`FAILURE_STATES`)."""
        return self.filter(state__in=FAILURE_STATES)

    def newest_first(self) -> JobRunQuerySet:
        """Latest occurrence first; per job, the ``(job, -scheduled_at, -id)`` index serves it."""
        return self.order_by("-scheduled_at", "-pk")

    def pks(self) -> Subquery:
        """The first row's id, as a subquery to annotate with."""
        return Subquery(self.values("pk")[:1])

    def due(self, now):
        return self.filter(state=RunState.PENDING, due_at__lte=now)

    def in_instance(self, instance: int) -> JobRunQuerySet:
        """The runs of one workflow instance: its root's run and every run that carries its id."""
        return self.filter(Q(pk=instance) | Q(instance=instance))

    def expired(self, now):
        return self.filter(state=RunState.RUNNING, lease_expires_at__lt=now)


class JobRun(models.Model):
    """One claimed occurrence and what happened to it; unique (job, key) is the claim."""

    # Every index is written by each claim: the job's lookups use the unique (job, key) index, and
    # the origin and finished_at indexes leave out the rows (new claims) that have neither.
    job = models.ForeignKey(
        JobDefinition, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    key = models.CharField(max_length=255)
    scheduled_at = models.DateTimeField()
    due_at = models.DateTimeField()
    state = models.CharField(max_length=10, choices=RunState.choices, default=RunState.PENDING)
    outcome = models.CharField(max_length=12, choices=Outcome.choices, default=Outcome.WON)
    attempt = models.PositiveIntegerField(default=1)
    node = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fence = models.BigIntegerField(default=1)
    priority = models.IntegerField(default=0)
    payload = models.JSONField(default=dict, blank=True, decoder=TolerantDecoder)
    #: A ``django.tasks`` run: the task's dotted path and the arguments it is called with. The
    #: database defaults keep the claim's INSERT, which does not name them, valid.
    task_path = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_("The django.tasks task this run executes."),
    )
    args = models.JSONField(
        default=list, db_default=[], blank=True, decoder=TolerantDecoder,
        help_text=_("A task's positional arguments."),
    )
    kwargs = models.JSONField(
        default=dict, db_default={}, blank=True, decoder=TolerantDecoder,
        help_text=_("A task's keyword arguments."),
    )
    result = models.JSONField(null=True, blank=True, decoder=TolerantDecoder)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    reason = models.CharField(max_length=200, blank=True)
    cause = models.CharField(
        max_length=16,
        choices=Cause.choices,
        blank=True,
        default=Cause.FIRST,
        help_text=_("Why the run is pending again (the reason says it in words)."),
    )
    cancel_requested = models.BooleanField(default=False)
    #: The W3C trace context (traceparent, tracestate) of the code that enqueued the run, which
    #: the node that runs it continues (observe.tracing); null when there was none. Nullable so
    #: the claim statements, which do not name it, need no change.
    trace_context = models.JSONField(null=True, blank=True, editable=False, decoder=TolerantDecoder)
    #: The job's id on scheduled runs of jobs that allow no overlap (the run takes its lane).
    lane = models.BigIntegerField(null=True, blank=True, editable=False)
    #: ``lane`` while the run is live (pending or running), NULL once it ended. The database
    #: computes it in the very write that changes the state, so no path can forget to free the
    #: lane, and a plain unique index on it lets at most one live laned run per job exist in the
    #: cluster: NULLs are distinct in unique indexes, so no partial index is needed (MariaDB and
    #: MySQL have none).
    live_lane = models.GeneratedField(
        expression=Case(When(state__in=LIVE_STATES, then=F("lane")), default=None),
        output_field=models.BigIntegerField(null=True),
        db_persist=True,
    )
    #: While pending: due_at - priority * PRIORITY_AGING in microseconds (see ranks), the order
    #: in which due pending runs are taken; an index serves it.
    pending_rank = models.BigIntegerField(null=True, blank=True, editable=False)
    origin = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="followers",
        db_index=False,
    )
    #: The workflow instance a dependent run belongs to: the id of the run of the root job whose
    #: occurrence started it (a root's own run leaves it empty: its id is the instance's).
    instance = models.BigIntegerField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobRunQuerySet.as_manager()

    class Meta:
        ordering = ["-scheduled_at", "-id"]
        verbose_name = _("run")
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="cluster_jobs_run_claim"),
            models.UniqueConstraint(fields=["live_lane"], name="cluster_jobs_run_live_lane"),
        ]
        indexes = [
            models.Index(
                fields=["state", "due_at", "priority"],
                name="cluster_jobs_run_due",
                condition=Q(state="pending"),
            ),
            models.Index(
                fields=["pending_rank", "due_at", "id"],
                name="cluster_jobs_run_rank",
                condition=Q(state="pending"),
            ),
            models.Index(
                fields=["-priority", "due_at", "id"],
                name="cluster_jobs_run_strict",
                condition=Q(state="pending"),
            ),
            models.Index(fields=["node", "state"], name="cluster_jobs_run_node"),
            models.Index(
                fields=["state", "lease_expires_at"],
                name="cluster_jobs_run_lease",
                condition=Q(state="running"),
            ),
            # A job's runs newest first, in the exact order every list and "last run" asks for,
            # so no plan prefers walking the whole ledger's order to find a quiet job's rows;
            # with the state, a job's last day is counted from the index alone.
            CoveringIndex(
                fields=["job", "-scheduled_at", "-id"],
                covering=["state"],
                name="cluster_jobs_run_job_recent",
            ),
            # A job's runs by id, as the API pages them.
            models.Index(fields=["job", "-id"], name="cluster_jobs_run_job_id"),
            # The whole ledger newest first (the admin's runs list), and the last day by job and
            # state from the index alone (the overview's strips).
            CoveringIndex(
                fields=["-scheduled_at", "-id"],
                covering=["job", "state"],
                name="cluster_jobs_run_recent",
            ),
            # Failures are few and written once, at their end: these cost a claim nothing, and
            # serve the failed states' lists, each job's last failure, the recent failures and
            # the dead letters by job.
            models.Index(
                fields=["-scheduled_at", "-id"],
                name="cluster_jobs_run_failed_recent",
                condition=Q(state__in=FAILURE_STATES),
            ),
            models.Index(
                fields=["job", "-scheduled_at", "-id"],
                name="cluster_jobs_run_job_failed",
                condition=Q(state__in=FAILURE_STATES),
            ),
            models.Index(
                fields=["-finished_at", "-id"],
                name="cluster_jobs_run_failed",
                condition=Q(state__in=FAILURE_STATES, finished_at__isnull=False),
            ),
            models.Index(fields=["job"], name="cluster_jobs_run_dead", condition=Q(state="dead")),
            models.Index(
                fields=["finished_at"],
                name="cluster_jobs_run_finished",
                condition=Q(finished_at__isnull=False),
            ),
            models.Index(
                fields=["origin"], name="cluster_jobs_run_origin", condition=Q(origin__isnull=False)
            ),
            models.Index(fields=["instance"], name="cluster_jobs_run_instance"),
        ]

    def __str__(self) -> str:
        # Its job is read only for its name: a job row that cannot be read names it by id.
        try:
            name = self.job.name
        except UNREADABLE:
            name = f"job {self.job_id}"
        return f"{name} @ {self.key}"

    def save(self, *args, **kwargs) -> None:
        """Save; a pending run stores its rank (see ranks) with it."""
        if self.state == RunState.PENDING:
            self.set_rank()
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "pending_rank"}
        super().save(*args, **kwargs)

    def set_rank(self) -> None:
        """Store the rank this run is taken by while pending (before a bulk_create)."""
        from .ranks import rank_of

        if self.due_at is not None and self.priority is not None:
            self.pending_rank = rank_of(self.due_at, self.priority)


class EventKind(models.TextChoices):
    CLAIMED = "claimed", _("claimed")
    STARTED = "started", _("started")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    RETRIED = "retried", _("retried")
    TIMED_OUT = "timed_out", _("timed out")
    CANCEL_REQUESTED = "cancel_req", _("cancel requested")
    CANCELLED = "cancelled", _("cancelled")
    LEASE_EXPIRED = "expired", _("lease expired")
    TAKEN_OVER = "taken_over", _("taken over")
    LOST = "lost", _("lost")
    FENCED_OUT = "fenced_out", _("fenced out")
    HANDED_BACK = "handed_back", _("handed back")
    NODE_LOST = "node_lost", _("node lost")
    DEAD_LETTERED = "dead", _("dead-lettered")
    REPLAYED = "replayed", _("replayed")
    SKIPPED = "skipped", _("skipped")
    MISSED = "missed", _("missed")
    LOG_LOST = "log_lost", _("log not stored")


class RunEvent(models.Model):
    """Append-only timeline of one run."""

    run = models.ForeignKey(JobRun, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=12, choices=EventKind.choices)
    node = models.CharField(max_length=200, blank=True)
    fence = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]
        verbose_name = _("run event")

    def __str__(self) -> str:
        return f"{self.kind} @ {self.at:%Y-%m-%d %H:%M:%S}"


class RunLog(models.Model):
    """One line a handler logged through ``ctx.logger``, stored with its run (see
    engine.runlog): stamped with the attempt, the node and the trace that logged it."""

    run = models.ForeignKey(JobRun, on_delete=models.CASCADE, related_name="logs")
    at = models.DateTimeField()
    level = models.PositiveSmallIntegerField(help_text=_("The logging level's number."))
    attempt = models.PositiveIntegerField()
    node = models.CharField(max_length=200, blank=True)
    trace_id = models.CharField(
        max_length=32, blank=True, help_text=_("The run's OpenTelemetry trace id, if traced.")
    )
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        verbose_name = _("run log line")

    def __str__(self) -> str:
        return f"{self.level_name} @ {self.at:%Y-%m-%d %H:%M:%S}"

    @property
    def level_name(self) -> str:
        """The level as logging names it (INFO, WARNING, …)."""
        return logging.getLevelName(self.level)


class NodeStatus(models.TextChoices):
    ACTIVE = "active", _("active")
    DRAINING = "draining", _("draining")
    STOPPED = "stopped", _("stopped")
    DEAD = "dead", _("dead")


#: The statuses of a node that is meant to be running.
LIVE_NODE = (NodeStatus.ACTIVE, NodeStatus.DRAINING)


class WorkerNode(models.Model):
    """One runscheduler process, with its heartbeat and what it decided."""

    node_id = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    process = models.CharField(
        max_length=200,
        blank=True,
        help_text=_("This registration's process identity: its host, process id and start time, "
                    "so a peer on the same host can tell that the process ended."),
    )  # fmt: skip
    version = models.CharField(max_length=50, blank=True)
    tags = models.JSONField(default=list, blank=True, decoder=TolerantDecoder)
    status = models.CharField(max_length=10, choices=NodeStatus.choices, default=NodeStatus.ACTIVE)
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    clock_offset_ms = models.FloatField(
        default=0.0, help_text=_("Database clock minus this node's clock, in milliseconds.")
    )
    claims_won = models.PositiveBigIntegerField(default=0)
    claims_lost = models.PositiveBigIntegerField(default=0)
    skipped = models.JSONField(
        default=dict, blank=True, decoder=TolerantDecoder, help_text=_("Skips counted by reason.")
    )

    class Meta:
        ordering = ["node_id"]
        verbose_name = _("worker node")

    def __str__(self) -> str:
        return self.node_id


#: The name of the leader's lease.
LEADER_LEASE = "leader"
#: The counter of changes to job definitions (see Counter).
DEFINITIONS = "definitions"


class Counter(models.Model):
    """A named counter of the ledger. ``definitions`` goes up with every change to a job
    definition (saved or deleted), in the change's transaction, so a node learns of a change
    from one value its heartbeat statement reads instead of scanning the definitions."""

    name = models.CharField(max_length=100, primary_key=True)
    value = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = _("counter")

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class LeaseQuerySet(models.QuerySet):
    def held(self, now: datetime | None = None) -> LeaseQuerySet:
        """Leases some holder holds at ``now`` (by default the database's clock, as leases run)."""
        return self.filter(expires_at__gt=Now() if now is None else now).exclude(holder="")

    def leader(self, now: datetime | None = None) -> LeaseQuerySet:
        """The leader lease while a node holds it (see :meth:`held`)."""
        return self.held(now).filter(name=LEADER_LEASE)


class Lease(models.Model):
    """A named, fenced, time-bounded lease: the leader and application cluster locks."""

    name = models.CharField(max_length=200, unique=True)
    holder = models.CharField(max_length=200, blank=True)
    token = models.CharField(max_length=64, blank=True)
    fence = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    objects = LeaseQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = _("lease")

    def __str__(self) -> str:
        return self.name


class ClusterEventKind(models.TextChoices):
    LEADER_ACQUIRED = "leader_acquired", _("became leader")
    LEADER_LOST = "leader_lost", _("lost leadership")
    NODE_DEAD = "node_dead", _("node marked dead")
    NODE_REVIVED = "node_revived", _("dead node came back")
    PURGED = "purged", _("ledger purged")
    REAPED = "reaped", _("expired leases reaped")
    BREAKER_OPENED = "breaker_opened", _("circuit breaker opened")
    CAUGHT_UP = "caught_up", _("missed occurrences settled")
    JOB_CHANGED = "job_changed", _("job paused, resumed, enabled or disabled")
    DRAIN_REQUESTED = "drain_requested", _("node asked to drain")


class ClusterEvent(models.Model):
    """Append-only log of what happened to the cluster rather than to one run."""

    at = models.DateTimeField()
    kind = models.CharField(max_length=20, choices=ClusterEventKind.choices)
    node = models.CharField(max_length=200, blank=True)
    fence = models.BigIntegerField(null=True, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = _("cluster event")
        indexes = [models.Index(fields=["at"], name="cluster_jobs_event_at")]

    def __str__(self) -> str:
        return f"{self.kind} @ {self.at:%Y-%m-%d %H:%M:%S}"

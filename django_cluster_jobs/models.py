"""The ledger: job definitions, runs (claims + history), run events, worker nodes and leases."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from . import schedules
from .exceptions import ClusterJobsError


class ScheduleKind(models.TextChoices):
    CRON = "cron", _("cron")
    EVERY = "every", _("fixed rate")
    DELAY = "delay", _("fixed delay")
    STARTUP = "startup", _("at startup")
    ON_DEMAND = "on_demand", _("on demand")


class Placement(models.TextChoices):
    CLUSTER = "cluster", _("once in the cluster")
    EVERY_NODE = "every_node", _("on every node")


class Delivery(models.TextChoices):
    AT_LEAST_ONCE = "at_least_once", _("at least once")
    AT_MOST_ONCE = "at_most_once", _("at most once")


class Overlap(models.TextChoices):
    SKIP = "skip", _("skip")
    ALLOW = "allow", _("allow")
    BUFFER_ONE = "buffer_one", _("buffer one")
    CANCEL_OTHER = "cancel_other", _("cancel the running one")


class Misfire(models.TextChoices):
    FIRE_ONCE = "fire_once", _("fire once now")
    SKIP = "skip", _("skip all")
    RUN_ALL = "run_all", _("run every missed one")


class Source(models.TextChoices):
    CODE = "code", _("code")
    DATABASE = "database", _("database")


class JobDefinitionQuerySet(models.QuerySet):
    def active(self):
        return self.filter(enabled=True)


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
    backoff = models.JSONField(default=dict, blank=True)
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
    requires = models.JSONField(default=list, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    paused_until = models.DateTimeField(null=True, blank=True)
    pause_reason = models.CharField(max_length=200, blank=True)
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


class Outcome(models.TextChoices):
    WON = "won", _("won the claim")
    EVERY_NODE = "every_node", _("every node")
    STARTUP = "startup", _("at startup")
    MANUAL = "manual", _("manual")
    ENQUEUED = "enqueued", _("enqueued")
    EXTERNAL = "external", _("external trigger")
    CATCH_UP = "catch_up", _("catch-up")
    MISSED = "missed", _("missed")
    RETRY = "retry", _("retry")
    REPLAY = "replay", _("replay")


class JobRunQuerySet(models.QuerySet):
    def live(self):
        return self.filter(state__in=LIVE_STATES)

    def due(self, now):
        return self.filter(state=RunState.PENDING, due_at__lte=now)

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
    payload = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    reason = models.CharField(max_length=200, blank=True)
    cancel_requested = models.BooleanField(default=False)
    #: The job's id on scheduled runs of jobs that allow no overlap; a partial unique index on
    #: live runs then lets at most one such run be pending or running in the whole cluster.
    lane = models.BigIntegerField(null=True, blank=True, editable=False)
    origin = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="followers",
        db_index=False,
    )
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobRunQuerySet.as_manager()

    class Meta:
        ordering = ["-scheduled_at", "-id"]
        verbose_name = _("run")
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="cluster_jobs_run_claim"),
            models.UniqueConstraint(
                fields=["lane"],
                condition=Q(state__in=("pending", "running")),
                name="cluster_jobs_run_one_live",
            ),
        ]
        indexes = [
            models.Index(
                fields=["state", "due_at", "priority"],
                name="cluster_jobs_run_due",
                condition=Q(state="pending"),
            ),
            models.Index(fields=["node", "state"], name="cluster_jobs_run_node"),
            models.Index(
                fields=["state", "lease_expires_at"],
                name="cluster_jobs_run_lease",
                condition=Q(state="running"),
            ),
            models.Index(fields=["job", "-scheduled_at"], name="cluster_jobs_run_job_recent"),
            models.Index(
                fields=["finished_at"],
                name="cluster_jobs_run_finished",
                condition=Q(finished_at__isnull=False),
            ),
            models.Index(
                fields=["origin"], name="cluster_jobs_run_origin", condition=Q(origin__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job.name} @ {self.key}"


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
    DEAD_LETTERED = "dead", _("dead-lettered")
    REPLAYED = "replayed", _("replayed")
    SKIPPED = "skipped", _("skipped")
    MISSED = "missed", _("missed")


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


class NodeStatus(models.TextChoices):
    ACTIVE = "active", _("active")
    DRAINING = "draining", _("draining")
    STOPPED = "stopped", _("stopped")
    DEAD = "dead", _("dead")


class WorkerNode(models.Model):
    """One runscheduler process, with its heartbeat and what it decided."""

    node_id = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    version = models.CharField(max_length=50, blank=True)
    tags = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=10, choices=NodeStatus.choices, default=NodeStatus.ACTIVE)
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    clock_offset_ms = models.FloatField(
        default=0.0, help_text=_("Database clock minus this node's clock, in milliseconds.")
    )
    claims_won = models.PositiveBigIntegerField(default=0)
    claims_lost = models.PositiveBigIntegerField(default=0)
    skipped = models.JSONField(default=dict, blank=True, help_text=_("Skips counted by reason."))

    class Meta:
        ordering = ["node_id"]
        verbose_name = _("worker node")

    def __str__(self) -> str:
        return self.node_id


class Lease(models.Model):
    """A named, fenced, time-bounded lease: the leader and application cluster locks."""

    name = models.CharField(max_length=200, unique=True)
    holder = models.CharField(max_length=200, blank=True)
    token = models.CharField(max_length=64, blank=True)
    fence = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

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

"""Every choice of a job's policy columns, in one place: the models' fields, the validator's
bounds, the decorator's defaults and the engine all read these (a leaf module: it imports only
Django's enums, so the validator can use it before the app registry is ready)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


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
    EXACTLY_ONCE = "exactly_once", _("exactly once (its writes to the ledger's database)")


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


class Executor(models.TextChoices):
    THREAD = "thread", _("a thread of the node")
    PROCESS = "process", _("a child process (hard timeout)")


class PauseCause(models.TextChoices):
    """Who paused a job: a code the doors read back, never parsed from the pause's reason."""

    NONE = "", _("not paused")
    OPERATOR = "operator", _("an operator")
    BREAKER = "breaker", _("its circuit breaker")


class BackoffKind(models.TextChoices):
    FIXED = "fixed", _("fixed")
    EXPONENTIAL = "exponential", _("exponential")
    EXPONENTIAL_JITTER = "exponential_jitter", _("exponential with full jitter")


class Outcome(models.TextChoices):
    WON = "won", _("won the claim")
    EVERY_NODE = "every_node", _("every node")
    STARTUP = "startup", _("at startup")
    MANUAL = "manual", _("manual")
    ENQUEUED = "enqueued", _("enqueued")
    EXTERNAL = "external", _("external trigger")
    CATCH_UP = "catch_up", _("catch-up")
    MISSED = "missed", _("missed")
    REPLAY = "replay", _("replay")
    AFTER = "after", _("after its predecessors")


#: The kinds whose runs fire on their own, with the definition's payload alone.
SELF_FIRING = (ScheduleKind.CRON, ScheduleKind.EVERY, ScheduleKind.DELAY, ScheduleKind.STARTUP)

"""The CLUSTER_JOBS setting, read through a typed object whose class attributes are the defaults."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from .bounds import NAME_MAX_LENGTH
from .exceptions import ImproperlyConfigured


class Defaults:
    """Documented defaults; every key of CLUSTER_JOBS must be one of these attributes."""

    #: This node's id; None means $POD_NAME / $HOSTNAME-like host name plus the pid.
    NODE_ID: str | None = None
    #: Tags this node advertises; jobs with ``requires=`` run only on nodes that have them.
    NODE_TAGS: tuple[str, ...] = ()
    #: Worker threads per node for running handlers.
    EXECUTOR_THREADS: int = 4
    #: Most occurrences claimed in one statement.
    CLAIM_BATCH_SIZE: int = 500
    #: Seconds a stopping node waits for running handlers before handing their runs back.
    GRACE_PERIOD: float = 30.0
    #: Seconds between polls for pending runs on databases without notifications.
    POLL_INTERVAL: float = 1.0
    #: Seconds a pending run waits to gain one priority point (aging, so low priorities cannot
    #: starve): runs are taken by ``priority + seconds overdue / PRIORITY_AGING``, highest first.
    #: None or 0 turns aging off (strict priority order).
    PRIORITY_AGING: float | None = 60.0
    #: Cluster-wide limits of running runs per queue, e.g. {"reports": 2}; queues not listed
    #: are unlimited.
    QUEUE_LIMITS: dict[str, int] = {}
    #: Database alias holding the ledger tables.
    DATABASE: str = "default"
    #: "auto", "postgresql", "sqlite" or "orm".
    COORDINATION: str = "auto"
    #: Whether a node's death is noticed at once (a session lock on PostgreSQL, a look at the
    #: process on SQLite) rather than when its leases expire. Turn it off behind a pooler in
    #: transaction mode, which cannot hold a session lock.
    PRESENCE: bool = True
    #: Seconds a run lease lasts without renewal.
    LEASE_TTL: float = 15.0
    #: Seconds between heartbeats (node row, run leases, clock offset).
    HEARTBEAT_INTERVAL: float = 5.0
    #: Seconds without heartbeat after which the leader marks a node dead.
    DEAD_AFTER: float = 60.0
    #: Seconds the leader lease lasts without renewal.
    LEADER_TTL: float = 15.0
    #: Days of finished runs kept in the ledger.
    RETENTION_DAYS: float = 14.0
    #: Dotted path of a Clock class to use instead of the system clock (tests inject skew).
    CLOCK: str | None = None
    #: Anchor of every fixed-rate grid, identical on every node.
    EPOCH: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    #: Largest payload, in bytes of JSON, of a job definition or a run (each run stores a copy).
    MAX_PAYLOAD_BYTES: int = 64 * 1024
    #: The lowest level of what a handler logs through ``ctx.logger`` that is stored with its run
    #: (a level name or number); None stores nothing.
    RUN_LOG_LEVEL: str | int | None = "INFO"
    #: Most log lines stored per attempt of a run; past it one marker line says what was dropped.
    RUN_LOG_MAX_LINES: int = 1000
    #: Most bytes (UTF-8) of log lines stored per attempt of a run.
    RUN_LOG_MAX_BYTES: int = 256 * 1024
    #: On a SQLite ledger, the longest timeout an exactly-once job may have without warning
    #: (cluster_jobs.W041): its transaction holds SQLite's one writer lock while it runs.
    EXACTLY_ONCE_SQLITE_SECONDS: float = 5.0
    #: TCP port of the node's probe server (/livez, /readyz, /startupz, /metrics); None serves
    #: none. ``runscheduler --probe-port`` overrides it.
    PROBE_PORT: int | None = None


KNOWN = frozenset(k for k in vars(Defaults) if k.isupper())


class Settings(Defaults):
    """Resolves each key from settings.CLUSTER_JOBS, falling back to Defaults."""

    _cache: dict[str, Any] | None = None

    def _user(self) -> dict[str, Any]:
        if self._cache is None:
            user = dict(getattr(django_settings, "CLUSTER_JOBS", {}) or {})
            unknown = sorted(set(user) - KNOWN)
            if unknown:
                raise ImproperlyConfigured(
                    f"Unknown CLUSTER_JOBS key(s) {', '.join(unknown)}; "
                    f"valid keys are {', '.join(sorted(KNOWN))}."
                )
            self._cache = user
        return self._cache

    def __getattribute__(self, name: str) -> Any:
        if name in KNOWN:
            return self._user().get(name, getattr(Defaults, name))
        return super().__getattribute__(name)

    def clear(self) -> None:
        self._cache = None

    def node_id(self) -> str:
        """The configured node id, or one made from the pod or host name and the pid (the name
        cut so that the id fits the node id columns, NAME_MAX_LENGTH characters)."""
        if self.NODE_ID:
            return str(self.NODE_ID)
        host = (os.environ.get("POD_NAME") or socket.gethostname()).replace("\x00", "")
        pid = f":{os.getpid()}"
        return f"{host[: NAME_MAX_LENGTH - len(pid)]}{pid}"


app_settings = Settings()


def ledger(model: Any) -> Any:
    """Return a plain queryset of ``model`` on the ledger database (the DATABASE setting)."""
    return model.objects.using(app_settings.DATABASE)


def _reset(*, setting: str, **_: Any) -> None:
    if setting == "CLUSTER_JOBS":
        app_settings.clear()


setting_changed.connect(_reset)

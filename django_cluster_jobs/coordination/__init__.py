"""Database coordination: one small interface, one module per database vendor."""

from __future__ import annotations

from django.db import connections

from ..conf import app_settings
from ..exceptions import ImproperlyConfigured
from .base import Claim, Coordinator, Heartbeat, NodeStats, WindowResult, Won

__all__ = [
    "Claim",
    "Coordinator",
    "Heartbeat",
    "NodeStats",
    "WindowResult",
    "Won",
    "get_coordinator",
]

CHOICES = ("auto", "postgresql", "sqlite", "orm")


def get_coordinator(alias: str | None = None, kind: str | None = None) -> Coordinator:
    """Return the coordinator for the ledger database; the only place that reads the vendor."""
    alias = alias or app_settings.DATABASE
    kind = kind or app_settings.COORDINATION
    if kind not in CHOICES:
        raise ImproperlyConfigured(
            f"CLUSTER_JOBS['COORDINATION'] is {kind!r}; choose one of {', '.join(CHOICES)}."
        )
    vendor = connections[alias].vendor
    if kind == "auto":
        kind = vendor if vendor in ("postgresql", "sqlite") else "orm"
    if kind != "orm" and kind != vendor:
        raise ImproperlyConfigured(
            f"CLUSTER_JOBS['COORDINATION'] is {kind!r} but database {alias!r} is {vendor}; "
            "use 'auto' or 'orm'."
        )
    if kind == "postgresql":
        from .postgresql import PostgreSQLCoordinator as cls
    elif kind == "sqlite":
        from .sqlite import SQLiteCoordinator as cls
    else:
        from .orm import ORMCoordinator as cls
    return cls(alias)

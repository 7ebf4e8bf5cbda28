"""The vendor layer: what each database answers its own way, behind one small interface.

:func:`get_vendor` picks the module for the ledger database; :func:`vendor_of` is the one place
that reads ``connection.vendor``.
"""

from __future__ import annotations

from django.db import connections

from ..conf import app_settings
from ..exceptions import ImproperlyConfigured
from .base import Features, Vendor, is_lock_timeout
from .types import (
    Claim,
    Ending,
    GateResult,
    GateState,
    Heartbeat,
    NodeStats,
    Peer,
    Refusal,
    WindowResult,
    Won,
)

__all__ = [
    "Claim",
    "Ending",
    "Features",
    "GateResult",
    "GateState",
    "Heartbeat",
    "NodeStats",
    "Peer",
    "Refusal",
    "Vendor",
    "WindowResult",
    "Won",
    "get_vendor",
    "is_lock_timeout",
    "vendor_of",
]

CHOICES = ("auto", "postgresql", "sqlite", "orm")


def vendor_of(alias: str) -> str:
    """Return the database vendor behind ``alias`` (``postgresql``, ``sqlite``, ``mysql`` …)."""
    return connections[alias].vendor


def get_vendor(alias: str | None = None, kind: str | None = None) -> Vendor:
    """Return the vendor for the ledger database, as CLUSTER_JOBS['COORDINATION'] asks."""
    alias = alias or app_settings.DATABASE
    kind = kind or app_settings.COORDINATION
    if kind not in CHOICES:
        raise ImproperlyConfigured(
            f"CLUSTER_JOBS['COORDINATION'] is {kind!r}; choose one of {', '.join(CHOICES)}."
        )
    vendor = vendor_of(alias)
    if kind == "auto":
        kind = vendor if vendor in ("postgresql", "sqlite") else "orm"
    if kind != "orm" and kind != vendor:
        raise ImproperlyConfigured(
            f"CLUSTER_JOBS['COORDINATION'] is {kind!r} but database {alias!r} is {vendor}; "
            "use 'auto' or 'orm'."
        )
    cls: type[Vendor]
    if kind == "postgresql":
        from .postgresql import PostgreSQLVendor as cls
    elif kind == "sqlite":
        from .sqlite import SQLiteVendor as cls
    else:
        from .orm import ORMVendor as cls
    return cls(alias)

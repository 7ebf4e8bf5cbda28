"""System checks; ids are stable and documented in docs/reference/checks.md."""

from __future__ import annotations

import sqlite3
from typing import Any

from django.core import checks

from .conf import app_settings
from .exceptions import ImproperlyConfigured


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E001: CLUSTER_JOBS has an unknown key or an invalid value."""
    app_settings.clear()
    try:
        from .coordination import get_coordinator

        get_coordinator()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(str(exc), hint="Fix the CLUSTER_JOBS setting.", id="cluster_jobs.E001")
        ]
    except Exception as exc:  # an unknown DATABASE alias, for instance
        return [
            checks.Error(
                f"CLUSTER_JOBS is unusable: {exc}",
                hint="Check CLUSTER_JOBS['DATABASE'] names an alias in DATABASES.",
                id="cluster_jobs.E001",
            )
        ]
    return []


@checks.register(checks.Tags.database)
def check_sqlite_version(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E002: SQLite is older than 3.35 (no RETURNING)."""
    if sqlite3.sqlite_version_info >= (3, 35):
        return []
    return [
        checks.Error(
            f"SQLite {sqlite3.sqlite_version} has no RETURNING clause (the SQLite claim needs it).",
            hint="Upgrade SQLite to 3.35 or newer, or set CLUSTER_JOBS['COORDINATION'] = 'orm'.",
            id="cluster_jobs.E002",
        )
    ]

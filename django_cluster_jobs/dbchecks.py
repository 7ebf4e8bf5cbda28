"""The system checks of what the ledger database can enforce (``check --database``).

Every guarantee rests on what the database itself enforces: a unique index decides a claim and
the lane of a job that allows no overlap. These checks read the database's features (never its
vendor's name) and say plainly what it cannot do, so nothing degrades in silence.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from .conf import app_settings

LANE_HINT = (
    "Use a database whose unique indexes admit any number of NULLs (PostgreSQL, SQLite, "
    "MariaDB, MySQL, Oracle), or a backend that can."
)
ZONES_HINT = (
    "Load the time zone definitions into the server: on MariaDB "
    "`mariadb-tzinfo-to-sql /usr/share/zoneinfo | mariadb -u root mysql`, on MySQL "
    "`mysql_tzinfo_to_sql /usr/share/zoneinfo | mysql -u root mysql`."
)
PARTIAL_HINT = (
    "Nothing to do. To keep `check --fail-level WARNING` clean on this database, add "
    '"models.W037" to SILENCED_SYSTEM_CHECKS (it silences the warning for every model).'
)


def check_database(databases: Any = None) -> list[checks.CheckMessage]:
    """cluster_jobs.E030, W030, I030: what the ledger database cannot enforce or answer."""
    if not databases:
        return []
    try:
        alias = app_settings.DATABASE
    except Exception:  # broken settings are cluster_jobs.E001's to report
        return []
    if alias not in databases:
        return []
    connection = connections[alias]
    return [
        message
        for check in (_lane, _zones, _partial)
        if (message := check(connection.features, alias, connection.display_name))
    ]


def _lane(features: Any, alias: str, name: str) -> checks.CheckMessage | None:
    if features.supports_nullable_unique_constraints:
        return None
    return checks.Error(
        f"The ledger database {alias!r} ({name}) lets a unique index hold one NULL only: the "
        "lane of a job that allows no overlap (a unique index over the lane of live runs, NULL "
        "for every other run) cannot be enforced.",
        hint=LANE_HINT,
        id="cluster_jobs.E030",
    )


def _zones(features: Any, alias: str, name: str) -> checks.CheckMessage | None:
    if not settings.USE_TZ or features.has_zoneinfo_database:
        return None
    return checks.Warning(
        f"The ledger database {alias!r} ({name}) has no time zone definitions: dates it "
        "converts to a time zone (the admin's, in the current time zone) come back empty and "
        "the pages that show them fail.",
        hint=ZONES_HINT,
        id="cluster_jobs.W030",
    )


def _partial(features: Any, alias: str, name: str) -> checks.CheckMessage | None:
    if features.supports_partial_indexes:
        return None
    return checks.Info(
        f"{name} has no partial indexes: the ledger's indexes with a condition (models.W037 "
        "on cluster_jobs.JobRun) are created whole. They only speed up queries; no guarantee "
        "depends on one.",
        hint=PARTIAL_HINT,
        id="cluster_jobs.I030",
    )

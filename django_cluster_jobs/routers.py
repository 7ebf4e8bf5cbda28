"""A database router that keeps the ledger on the database named by CLUSTER_JOBS["DATABASE"].

Add it to ``DATABASE_ROUTERS`` when the ledger has a database of its own::

    DATABASE_ROUTERS = ["django_cluster_jobs.routers.LedgerRouter"]

The app's models are then read and written on that alias wherever a query names no database,
including the project's own code and third-party apps, and ``migrate --database <alias>`` is the
only migrate that creates their tables. Models of every other app are left to the routers after
it, or to Django's default.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model

from .conf import app_settings

#: The app label of the ledger's models (set from the first migration, see apps.py).
LABEL = "cluster_jobs"


class LedgerRouter:
    """Route the ``cluster_jobs`` models to the ledger database and migrate them only there."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return app_settings.DATABASE if model._meta.app_label == LABEL else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return app_settings.DATABASE if model._meta.app_label == LABEL else None

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool | None:
        ours = {obj._meta.app_label == LABEL for obj in (obj1, obj2)}
        return True if ours == {True} else None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return db == app_settings.DATABASE if app_label == LABEL else None

"""An index with covering columns where the database can store them, and without elsewhere."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from django.db import models


class CoveringIndex(models.Index):
    """An index that stores the ``covering`` columns beside its keys (``INCLUDE``) where the
    database can, so that PostgreSQL answers from the index alone, and that every other
    database builds on its keys alone.

    Django's own ``include=`` builds the same indexes, but reports models.W040 on each database
    that has no covering indexes (SQLite, MariaDB, MySQL) on every ``manage.py check`` of the
    projects that use this app, a warning they could only silence for every model.
    """

    def __init__(self, *args: Any, covering: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.covering = tuple(covering)

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        kwargs["covering"] = self.covering
        return path, args, kwargs

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        # The schema editor leaves INCLUDE out where the database has no covering indexes.
        index = copy.copy(self)
        index.include = self.covering
        return models.Index.create_sql(index, model, schema_editor, using, **kwargs)

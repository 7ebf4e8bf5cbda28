"""Rows written with raw SQL, as another program, an older version or an operator could write
them: values the validator would refuse, or that Python cannot read back."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection

#: JSON nested deeper than the app reads (stored.READ_DEPTH_MAX), which PostgreSQL's jsonb and
#: SQLite's JSON check hold (SQLite's refuses more than 1000 levels; MariaDB's more than 31).
DEEP = "[" * 900 + "]" * 900


def store_raw(model, pk: int, column: str, literal: str, *params: object) -> None:
    """Write ``column`` of a row with raw SQL, as another program (or an operator) could."""
    table, column = (connection.ops.quote_name(name) for name in (model._meta.db_table, column))
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = {literal} WHERE id = %s", [*params, pk])


def store_deep_json(model, pk: int, column: str) -> None:
    """Store DEEP in a JSON column; skip where the database refuses to hold it (nothing can
    then be read back)."""
    literal = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    try:
        store_raw(model, pk, column, literal, DEEP)
    except DatabaseError as exc:
        pytest.skip(f"{connection.vendor} refuses such JSON at the write: {exc}")

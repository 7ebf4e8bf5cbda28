"""The run indexes with covering columns: INCLUDE where the database has it, keys elsewhere,
and no models.W040 from ``check`` on any database."""

from __future__ import annotations

import pytest
from django.db import connection

from django_cluster_jobs.indexes import CoveringIndex
from django_cluster_jobs.models import JobRun

pytestmark = pytest.mark.django_db(transaction=True)  # SQLite's schema editor needs no atomic


@pytest.mark.parametrize("name", ["cluster_jobs_run_recent", "cluster_jobs_run_job_recent"])
def test_covering_columns_are_included_only_where_the_database_can(name):
    index = next(i for i in JobRun._meta.indexes if i.name == name)
    assert isinstance(index, CoveringIndex) and index.covering and not index.include
    with connection.schema_editor(collect_sql=True) as editor:
        sql = str(index.create_sql(JobRun, editor))
    assert ("INCLUDE" in sql) == connection.features.supports_covering_indexes, sql


def test_the_ledger_tables_index_includes_the_covering_columns_where_it_can():
    """What migrate built: the same index as the model declares, covering columns and all."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, JobRun._meta.db_table)
    columns = found["cluster_jobs_run_recent"]["columns"]
    assert columns[:2] == ["scheduled_at", "id"]


def test_the_run_model_checks_without_a_covering_index_warning():
    assert not [m for m in JobRun.check(databases=["default"]) if m.id == "models.W040"]

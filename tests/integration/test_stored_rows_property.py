"""Stored rows are data, never control flow: a property over what the tables can hold.

Hypothesis writes, with raw SQL as another program, an older version or an operator could, values
into the columns of a job definition and of a run: each type's extremes, values Python cannot
represent (PostgreSQL's infinite timestamps, intervals beyond ``timedelta``, SQLite's text in a
number or date column), deep and wide JSON, numbers no float holds, control characters, text
longer than the column, choices nobody defined. A value the database refuses at the write is
simply not stored. Then, with those rows in place:

- a node reloads and ticks without a failing tick, and a healthy run beside them is served;
- no admin page and no API endpoint answers 500: the lists, the bad rows' own pages, the
  overview, the occurrence story, the status report.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
from django.db import DatabaseError, connection, models
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_cluster_jobs import services
from django_cluster_jobs.engine import Node
from django_cluster_jobs.models import JobDefinition, JobRun, RunState
from tests.api_fixtures import url
from tests.factories import JobDefinitionFactory, JobRunFactory
from tests.nodes import served
from tests.raw_rows import DEEP

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timing]

EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    # One node and one client serve every example; each example's rows are its own.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

WIDE = "{" + ",".join(f'"k{i}": {i}' for i in range(20_000)) + "}"
#: JSON another program may store: deep, wide, numbers beyond a float, not an object.
JSON = [DEEP, WIDE, '{"n": 1e400}', "[1e400]", '"text"', "null", "[]", "0", '{"a": "\\u0000"}']
#: Text a column may hold that no form would let through.
TEXT = ["", "\x01\x1b[31m\u202e", "x" * 5000, "bogus", "' OR 1=1 --", "é" * 300, "0"]

LITERALS: dict[str, dict[str, list[str]]] = {
    "postgresql": {
        "datetime": ["'infinity'", "'-infinity'", "'294276-12-31 23:59:59+00'",
                     "'4713-01-01 00:00:00+00 BC'", "'0001-01-01 00:00:00+00'",
                     "'9999-12-31 23:59:59.999999+00'"],
        "duration": ["'178000000 years'", "'-178000000 years'", "'2000000000 days'",
                     "'-1 microseconds'", "'0'"],
        "integer": ["2147483647", "-2147483648", "0", "-1"],
        "bigint": ["9223372036854775807", "-9223372036854775808", "0"],
        "boolean": ["true", "false"],
        "float": ["'NaN'", "'Infinity'", "'-Infinity'", "1e308"],
    },
    "sqlite": {
        "datetime": ["'not a date'", "''", "'9999-12-31 23:59:59.999999'",
                     "'0001-01-01 00:00:00'", "1e400", "-1", "X'00ff'"],
        "duration": ["9223372036854775807", "-9223372036854775808", "'ten minutes'", "1.5e300",
                     "-1"],
        "integer": ["9223372036854775807", "-9223372036854775808", "'abc'", "1.5", "-1"],
        "bigint": ["9223372036854775807", "-9223372036854775808", "'abc'", "1e400"],
        "boolean": ["2", "'yes'", "-1"],
        "float": ["'abc'", "1e400", "-1e400"],
    },
}  # fmt: skip
KINDS = {
    models.DateTimeField: "datetime",
    models.DurationField: "duration",
    models.BigIntegerField: "bigint",
    models.IntegerField: "integer",
    models.BooleanField: "boolean",
    models.FloatField: "float",
    models.JSONField: "json",
    models.TextField: "text",
    models.CharField: "text",
}


def kind(field: models.Field) -> str | None:
    for cls, name in KINDS.items():
        if isinstance(field, cls):
            return name
    return None


def columns(model: type[models.Model]) -> list[str]:
    """The columns of ``model`` a write can set (not the key nor a generated column)."""
    return [
        field.column
        for field in model._meta.concrete_fields
        if not field.primary_key
        and not isinstance(field, models.GeneratedField)
        and kind(field) is not None
    ]


@dataclass(frozen=True)
class Write:
    """One raw write: ``column`` of the bad row of ``model`` set to a SQL ``literal``, with
    ``params``."""

    model: type[models.Model]
    column: str
    literal: str
    params: tuple[str, ...] = ()

    def __str__(self) -> str:
        shown = self.params[0][:40] if self.params else self.literal[:40]
        return f"{self.model.__name__}.{self.column} = {shown!r}"


def values_for(model: type[models.Model], column: str) -> st.SearchStrategy[Write]:
    field = next(f for f in model._meta.concrete_fields if f.column == column)
    name = kind(field)
    if name == "json":
        cast = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
        return st.sampled_from(JSON).map(lambda text: Write(model, column, cast, (text,)))
    if name == "text":
        texts = st.sampled_from(TEXT) | st.text(st.characters(exclude_categories=("Cs",)),
                                                max_size=30)  # fmt: skip
        return texts.map(lambda text: Write(model, column, "%s", (text,)))
    literals = LITERALS[connection.vendor][name] + ["NULL"]
    return st.sampled_from(literals).map(lambda literal: Write(model, column, literal))


def writes() -> st.SearchStrategy[list[Write]]:
    pairs = [(model, column) for model in (JobDefinition, JobRun) for column in columns(model)]
    one = st.one_of(*(values_for(model, column) for model, column in pairs))
    return st.lists(one, min_size=1, max_size=4)


def store(write: Write, pk: int) -> bool:
    """Make the write; False when the database refuses it (a constraint, a range, a type)."""
    table = connection.ops.quote_name(write.model._meta.db_table)
    column = connection.ops.quote_name(write.column)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET {column} = {write.literal} WHERE id = %s",
                           [*write.params, pk])  # fmt: skip
    except DatabaseError:
        return False
    return True


def forget(job_pk: int) -> None:
    """Delete the example's rows with raw SQL (reading them back may be what fails)."""
    quote = connection.ops.quote_name
    runs = f"SELECT id FROM {quote(JobRun._meta.db_table)} WHERE job_id = %s"
    with connection.cursor() as cursor:
        for table in ("cluster_jobs_runevent", "cluster_jobs_runlog"):
            cursor.execute(f"DELETE FROM {quote(table)} WHERE run_id IN ({runs})", [job_pk])
        cursor.execute(f"UPDATE {quote(JobRun._meta.db_table)} SET origin_id = NULL "
                       f"WHERE origin_id IN ({runs})", [job_pk])  # fmt: skip
        cursor.execute(f"DELETE FROM {quote(JobRun._meta.db_table)} WHERE job_id = %s", [job_pk])
        cursor.execute(f"DELETE FROM {quote(JobDefinition._meta.db_table)} WHERE id = %s",
                       [job_pk])  # fmt: skip


def pages(job: JobDefinition, run: JobRun) -> list[str]:
    """Every admin page and API endpoint that reads the bad rows."""
    admin = [reverse(f"admin:cluster_jobs_{model}_changelist")
             for model in ("jobdefinition", "jobrun", "runevent", "workernode", "lease",
                           "clusterevent")]  # fmt: skip
    for name, pk in (("jobdefinition", job.pk), ("jobrun", run.pk)):
        admin += [reverse(f"admin:cluster_jobs_{name}_{view}", args=[pk])
                  for view in ("change", "delete", "history")]  # fmt: skip
    admin += [
        f"{reverse('admin:cluster_jobs_jobrun_changelist')}?job={job.pk}",
        reverse("admin:cluster_jobs_overview"),
        f"{reverse('admin:cluster_jobs_occurrence')}?job={job.name}",
        reverse("admin:cluster_jobs_instance", args=[run.pk]),
    ]
    api = [url("job-list"), url("job-detail", job.name), url("run-list"),
           url("run-detail", run.pk), url("node-list"), url("instance-list"), url("status"),
           url("leader"), f"{url('run-list')}?job={job.name}"]  # fmt: skip
    return admin + api


@pytest.mark.skipif(connection.vendor not in LITERALS, reason="raw values per database")
def test_stored_rows_never_stop_a_node_nor_answer_500(admin_client, viewer, caplog):
    node = Node("stored-rows", threads=2)
    node.start()
    try:

        @EXAMPLES
        @given(writes())
        def check(chosen: list[Write]) -> None:
            job = JobDefinitionFactory(callable_name="tests.manual", cron="* * * * *")
            run = JobRunFactory(job=job, state=RunState.PENDING, payload={"value": 1})
            rows = {JobDefinition: job.pk, JobRun: run.pk}
            stored = [write for write in chosen if store(write, rows[write.model])]
            try:
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="django_cluster_jobs"):
                    node.reload()
                    node.tick()
                    try:
                        healthy = served(node, services.enqueue("tests.manual", {"value": 2}))
                    except BaseException as exc:  # pytest.fail's too: name what was stored
                        said = [r.getMessage()[:300] for r in caplog.records][:5]
                        raise AssertionError([str(write) for write in stored], said) from exc
                assert healthy.state == RunState.SUCCEEDED, (stored, healthy.error)
                failed = [r.getMessage() for r in caplog.records if "tick of" in r.getMessage()]
                assert not failed, (stored, failed)
                for path in pages(job, run):
                    client = admin_client if path.startswith("/admin/") else viewer
                    status = client.get(path).status_code
                    assert status < 500, (path, [str(write) for write in stored])
            finally:
                forget(job.pk)

        check()
    finally:
        node.stop()

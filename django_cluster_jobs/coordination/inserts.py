"""One pending run in one statement: the INSERT reads the job's definition row itself.

``INSERT … SELECT … FROM <definitions> WHERE name = %s AND callable_name = %s`` stores the run
with the definition's id and default priority as the row has them at that instant, so an enqueue
never uses a stale copy of the definition: a deleted job (or one whose handler changed since the
caller validated the payload against it) inserts nothing, and the caller looks the definition up
again. The run's due time (cluster time unless given), its creation time and its stored rank
(:mod:`django_cluster_jobs.ranks`) are computed by the statement too. On PostgreSQL the
statement also sends the pending notification (:data:`postgresql.PENDING_CHANNEL`), which the
server delivers at commit, never after a rollback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..bounds import PRIORITY_MAX, PRIORITY_MIN
from ..models import JobRun
from ..ranks import aging_us
from . import sql

#: Run columns the statement computes from the definition row and the clock.
COMPUTED = ("job_id", "priority", "scheduled_at", "due_at", "created_at", "pending_rank")

# One pending run. {columns}/{values}: the run's other columns and their placeholders; {now}:
# cluster time; {due}: the due time (a parameter, or {now}); {due_us}: the due time in
# microseconds since 1970. Parameters: the values, the clamp's bounds (low, low, high, high),
# the aging in microseconds, then those of the subquery: the given priority (or NULL), those of
# {now} and {due}, the job's name and its callable's name.
INSERT_PENDING = f"""
INSERT INTO {sql.RUN} ({{columns}}, job_id, priority, scheduled_at, due_at, created_at,
                       pending_rank)
SELECT {{values}}, v.id, v.priority, v.due, v.due, v.now,
       {{due_us}} - CAST(CASE WHEN v.priority < %s THEN %s WHEN v.priority > %s THEN %s
                          ELSE v.priority END AS BIGINT) * %s
FROM (SELECT d.id AS id, COALESCE(%s, d.priority) AS priority, {{now}} AS now, {{due}} AS due
      FROM {sql.JOB} AS d WHERE d.name = %s AND d.callable_name = %s) AS v
RETURNING id, job_id, priority, due_at, created_at, pending_rank
"""


@dataclass(frozen=True)
class Clock:
    """How a vendor's statement reads the time: SQL for cluster time, the due time and its
    microseconds, with their parameters in the order the SQL uses them."""

    now: str
    due: str
    due_us: str
    now_params: tuple[Any, ...] = ()
    due_params: tuple[Any, ...] = ()
    due_us_params: tuple[Any, ...] = ()


def insert_pending(
    connection: Any, run: JobRun, name: str, callable_name: str, priority: int | None, clock: Clock
) -> tuple[str, list[Any]]:
    """Return the statement that stores ``run`` (every column but :data:`COMPUTED` set) as a
    pending run of job ``name``, and its parameters."""
    fields = [
        f for f in JobRun._meta.local_concrete_fields
        if not f.primary_key and not f.generated and f.attname not in COMPUTED
    ]  # fmt: skip
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    values = [f.get_db_prep_save(f.pre_save(run, True), connection) for f in fields]
    query = INSERT_PENDING.format(
        columns=columns, values=", ".join(["%s"] * len(fields)), now=clock.now, due=clock.due,
        due_us=clock.due_us,
    )  # fmt: skip
    bounds = [PRIORITY_MIN, PRIORITY_MIN, PRIORITY_MAX, PRIORITY_MAX, aging_us()]
    params = [*values, *clock.due_us_params, *bounds, priority, *clock.now_params]
    return query, [*params, *clock.due_params, name, callable_name]


def stored(run: JobRun, row: tuple[Any, ...], alias: str, *, times: bool = True) -> JobRun:
    """``run`` as the statement stored it (``row`` is what it returned); without ``times`` the
    run's due and creation times are those it was stored with already."""
    run.pk, run.job_id, run.priority, due, created, run.pending_rank = row[:6]
    if times:
        run.scheduled_at = run.due_at = due
        run.created_at = created
    run._state.adding, run._state.db = False, alias
    return run

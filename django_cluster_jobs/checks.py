"""System checks; ids are stable and documented in docs/reference/checks.md."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeGuard

from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils.module_loading import import_string

from . import bounds as b
from .columns import holds_a_name, unstorable
from .conf import Defaults, app_settings
from .coordination import vendor_of
from .exceptions import ImproperlyConfigured, shown

SETTINGS_HINT = "Fix the CLUSTER_JOBS setting."


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _between(low: float, high: float, *, above: bool = False, whole: bool = False
             ) -> Callable[[object], bool]:  # fmt: skip
    """A number from ``low`` (excluded when ``above``) to ``high``: never NaN or infinite."""

    def valid(value: object) -> bool:
        if not _number(value) or (whole and not isinstance(value, int)):
            return False
        return (low < value if above else low <= value) and value <= high

    return valid


def _count(high: int) -> Callable[[object], bool]:
    return _between(1, high, whole=True)


def _seconds(value: object) -> bool:
    return _between(0, b.SETTING_SECONDS_MAX, above=True)(value)


def _importable(value: object) -> bool:
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    try:
        import_string(value)
    except ImportError:
        return False
    return True


def _port(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and 0 <= value <= 65535)  # fmt: skip


def _level(value: object) -> bool:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value is None or value >= 0
    return isinstance(value, str) and value.upper() in logging.getLevelNamesMapping()


def _node_id(value: object) -> bool:
    return value is None or (isinstance(value, str) and value != "" and holds_a_name(value))


def _tags(value: object) -> bool:
    return (
        isinstance(value, list | tuple | set | frozenset)
        and len(value) <= b.TAGS_MAX
        and all(
            isinstance(tag, str) and len(tag) <= b.TAG_MAX_LENGTH and unstorable(tag) is None
            for tag in value
        )
    )


def _queue_limits(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(queue, str) and len(queue) <= b.QUEUE_MAX_LENGTH and _count(b.COUNT_MAX)(n)
        for queue, n in value.items()
    )


def _epoch(value: object) -> bool:
    return (
        isinstance(value, datetime)
        and value.utcoffset() is not None
        and b.EARLIEST_RUN_AT <= value <= b.LATEST_RUN_AT
    )


#: The longest timing, in words.
LONGEST = f"{b.SETTING_SECONDS_MAX} ({b.SETTING_SECONDS_MAX // 86400} days)"
SECONDS = f"a positive number of seconds, at most {LONGEST}"
COUNT = f"1 to {b.COUNT_MAX}"

#: What each CLUSTER_JOBS value must be: key -> (test, description used in the message).
#: DATABASE and COORDINATION are checked by building the vendor.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "NODE_ID": (
        _node_id,
        f"None or a non-empty str of at most {b.NAME_MAX_LENGTH} characters, without NUL",
    ),
    "NODE_TAGS": (
        _tags,
        f"a list or tuple of at most {b.TAGS_MAX} str, each at most {b.TAG_MAX_LENGTH} characters",
    ),
    "EXECUTOR_THREADS": (_count(b.THREADS_MAX), f"a whole number, 1 to {b.THREADS_MAX}"),
    "CLAIM_BATCH_SIZE": (_count(b.CLAIM_BATCH_MAX), f"a whole number, 1 to {b.CLAIM_BATCH_MAX}"),
    "GRACE_PERIOD": (
        _between(0, b.SETTING_SECONDS_MAX),
        f"a number of seconds, 0 to {LONGEST}",
    ),
    "POLL_INTERVAL": (_seconds, SECONDS),
    "PRESENCE": (lambda v: isinstance(v, bool), "True or False"),
    "LEASE_TTL": (_seconds, SECONDS),
    "HEARTBEAT_INTERVAL": (_seconds, SECONDS),
    "DEAD_AFTER": (_seconds, SECONDS),
    "LEADER_TTL": (_seconds, SECONDS),
    "RETENTION_DAYS": (
        _between(0, b.RETENTION_DAYS_MAX, above=True),
        f"a positive number of days, at most {b.RETENTION_DAYS_MAX}",
    ),
    "QUEUE_LIMITS": (
        _queue_limits,
        f"a dict of queue name (at most {b.QUEUE_MAX_LENGTH} characters) to a whole number, "
        f"{COUNT}",
    ),
    "PRIORITY_AGING": (
        lambda v: v is None or _between(0, b.MAX_INTERVAL.total_seconds())(v),
        f"None or seconds, 0 to {int(b.MAX_INTERVAL.total_seconds())}",
    ),
    "CLOCK": (_importable, "None or the dotted path of an importable clock class"),
    "EPOCH": (
        _epoch,
        f"an aware datetime from {b.EARLIEST_RUN_AT.date()} to {b.LATEST_RUN_AT.date()}",
    ),
    "MAX_PAYLOAD_BYTES": (_count(b.COUNT_MAX), f"a whole number of bytes, {COUNT}"),
    "RUN_LOG_LEVEL": (_level, 'None, a logging level\'s name ("INFO") or a number, 0 or more'),
    "RUN_LOG_MAX_LINES": (_count(b.COUNT_MAX), f"a whole number of lines, {COUNT}"),
    "RUN_LOG_MAX_BYTES": (_count(b.COUNT_MAX), f"a whole number of bytes, {COUNT}"),
    "EXACTLY_ONCE_SQLITE_SECONDS": (_seconds, SECONDS),
    "PROBE_PORT": (_port, "None or a TCP port number, 0 to 65535 (0: any free port)"),
}


def setting_problem(key: str, value: object) -> str | None:
    """What is wrong with ``value`` for the CLUSTER_JOBS ``key`` ("it must be ..."), or None:
    the one rule for the setting and for the runscheduler option that overrides it."""
    valid, expected = RULES[key]
    return None if valid(value) else f"it must be {expected}"


def _value_errors() -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    for key in RULES:
        value, default = getattr(app_settings, key), getattr(Defaults, key)
        if problem := setting_problem(key, value):
            errors.append(
                checks.Error(
                    f"CLUSTER_JOBS[{key!r}] is {shown(value)}; {problem}.",
                    hint=f"Fix it, or remove the key to use the default {default!r}.",
                    id="cluster_jobs.E001",
                )
            )
    return errors


def _coordination_errors() -> list[checks.CheckMessage]:
    from .coordination import get_vendor

    try:
        get_vendor()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint=SETTINGS_HINT, id="cluster_jobs.E001")]
    except Exception as exc:  # an unknown DATABASE alias, for instance
        return [
            checks.Error(
                f"CLUSTER_JOBS is unusable: {exc}",
                hint="Check CLUSTER_JOBS['DATABASE'] names an alias in DATABASES.",
                id="cluster_jobs.E001",
            )
        ]
    return []


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E001: CLUSTER_JOBS has an unknown key or an invalid value."""
    app_settings.clear()
    try:
        errors = _value_errors()
    except ImproperlyConfigured as exc:  # an unknown key: nothing else can be read
        return [checks.Error(str(exc), hint=SETTINGS_HINT, id="cluster_jobs.E001")]
    return errors + _coordination_errors()


def _uses_sqlite_claims() -> bool:
    try:
        alias, kind = app_settings.DATABASE, app_settings.COORDINATION
        vendor = vendor_of(alias)
    except Exception:  # broken settings are cluster_jobs.E001's to report
        return False
    return vendor == "sqlite" and kind in ("auto", "sqlite")


# Not tagged "database": it reads the sqlite3 library's version and never connects, so
# `manage.py check` (not only `migrate` or `check --database`) reports it.
@checks.register()
def check_sqlite_version(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E002: the ledger is on SQLite older than 3.35 (no RETURNING)."""
    if sqlite3.sqlite_version_info >= (3, 35) or not _uses_sqlite_claims():
        return []
    return [
        checks.Error(
            f"SQLite {sqlite3.sqlite_version} has no RETURNING clause (the SQLite claim needs it).",
            hint="Upgrade SQLite to 3.35 or newer, or set CLUSTER_JOBS['COORDINATION'] = 'orm'.",
            id="cluster_jobs.E002",
        )
    ]


def _settings_readable() -> bool:
    try:
        return not _value_errors()
    except ImproperlyConfigured:
        return False


@checks.register()
def check_timings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.W002: a lease or the dead-node threshold fits fewer than two heartbeats."""
    if not _settings_readable():
        return []
    beat = app_settings.HEARTBEAT_INTERVAL
    warnings: list[checks.CheckMessage] = []
    for key in ("LEASE_TTL", "LEADER_TTL", "DEAD_AFTER"):
        value = getattr(app_settings, key)
        if value < 2 * beat:
            warnings.append(
                checks.Warning(
                    f"CLUSTER_JOBS['{key}'] ({value:g}s) is shorter than two heartbeats "
                    f"(HEARTBEAT_INTERVAL is {beat:g}s): one late heartbeat loses it.",
                    hint=f"Make {key} at least {2 * beat:g}s, or beat more often.",
                    id="cluster_jobs.W002",
                )
            )
    return warnings


@checks.register()
def check_sqlite_transactions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E005: the ledger is on SQLite without immediate transactions."""
    try:
        alias = app_settings.DATABASE
        connection = connections[alias]
    except Exception:  # broken settings are cluster_jobs.E001's to report
        return []
    mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
    if vendor_of(alias) != "sqlite" or str(mode).upper() == "IMMEDIATE":
        return []
    return [
        checks.Error(
            f"The ledger database {alias!r} is SQLite with transaction_mode {mode!r}: a write "
            "that starts as a read cannot wait for the lock, so nodes fail with 'database is "
            "locked'.",
            hint=f'Add "transaction_mode": "IMMEDIATE" to DATABASES[{alias!r}][\'OPTIONS\'] '
            '(with a busy timeout), e.g. "OPTIONS": {"transaction_mode": "IMMEDIATE", '
            '"timeout": 20}.',
            id="cluster_jobs.E005",
        )
    ]


def _stored() -> list[Any]:
    from .models import JobDefinition

    try:
        return list(JobDefinition.objects.using(app_settings.DATABASE).order_by("name"))
    except Exception:  # tables not migrated yet: nothing stored to check
        return []


# cluster_jobs.E003 (a stored definition naming an unregistered callable, an error) is retired:
# such a definition is orphaned, cluster_jobs.W003, and never blocks a command.
@checks.register(checks.Tags.database)
def check_stored_definitions(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.W003: a definition is orphaned; W004: a database job no node can use."""
    from .validation import is_orphaned, row_errors

    found: list[checks.CheckMessage] = []
    for row in _stored():
        if is_orphaned(row):
            found.append(_orphaned(row))
        elif row.source == "database" and (problems := row_errors(row)):
            found.append(_unusable(row, problems))
    return found


def _orphaned(row: Any) -> checks.Warning:
    if row.source == "code":
        hint = (
            "Its code was renamed or removed: declare it again with @job, or delete the row in "
            "the admin (its runs go with it)."
        )
    else:
        hint = "Point it at a registered job in the admin, or delete it there."
    return checks.Warning(
        f"Job {row.name!r} is orphaned: its callable {row.callable_name!r} is not registered, "
        "so no node runs it.",
        hint=hint,
        id="cluster_jobs.W003",
    )


def _unusable(row: Any, problems: list[Any]) -> checks.Warning:
    details = "; ".join(f"invalid {p.field} {shown(p.value)}: {p.hint}" for p in problems)
    return checks.Warning(
        f"Job {row.name!r} is stored with a definition no node can use: {details}",
        hint="Correct it in the admin; until then no node plans it.",
        id="cluster_jobs.W004",
    )


@checks.register(checks.Tags.database)
def check_code_names(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E004: a code job has the name of a job an operator defined in the database."""
    from .registry import registry

    return [
        checks.Error(
            f"The code job {row.name!r} (declared by {registry.get(row.name).origin}) has the "
            "name of a job an operator defined in the database (running "
            f"{row.callable_name!r}).",
            hint="Rename one of them: give the code job another name with @job(name=...), or "
            "rename the database job in the admin.",
            id="cluster_jobs.E004",
        )
        for row in _stored()
        if row.source == "database" and row.name in registry
    ]


@checks.register()
def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E020, E022: TASKS names the django.tasks backend without its API or app."""
    from .tasks.checks import check_tasks as check

    return check(app_configs, **kwargs)


@checks.register(checks.Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """cluster_jobs.E030, W030, I030: what the ledger database cannot enforce or answer."""
    from .dbchecks import check_database as check

    return check(databases)


def _dependency_messages(problems: list[Any], *, stored: bool) -> list[checks.CheckMessage]:
    """E006 (errors) for the code's own graph; W007 (warnings) once stored jobs join it."""
    level, check_id = (checks.Warning, "W007") if stored else (checks.Error, "E006")
    where = "in its @job declaration"
    if stored:
        where = "in the admin, or define the job it names again"
    return [
        level(
            f"Job {p.job!r}: invalid after {shown(p.value)}: {p.hint}",
            hint=f"Fix the job's after= (its predecessors) {where}; until then the jobs it names "
            "never queue it.",
            id=f"cluster_jobs.{check_id}",
        )
        for p in problems
    ]


def _code_graph() -> tuple[dict[str, list[str]], set[str]]:
    from .registry import registry

    jobs = list(registry)
    return {j.name: list(j.after) for j in jobs if j.after}, {j.name for j in jobs}


@checks.register()
def check_code_dependencies(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E006: a code job waits for an unknown job, or its dependencies make a cycle."""
    from .validation import graph_errors

    graph, known = _code_graph()
    return _dependency_messages(graph_errors(graph, known), stored=False)


# cluster_jobs.E007 (the same, an error) is retired: one delete in the admin, or a job removed from
# the code with its row, made migrate, check and runscheduler exit. Stored rows warn, never stop.
@checks.register(checks.Tags.database)
def check_stored_dependencies(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.W007: with the database-defined jobs, a predecessor is unknown or the
    dependencies make a cycle (what E006 already says of code jobs alone is not repeated)."""
    from .validation import graph_errors

    graph, known = _code_graph()
    alone = {str(p) for p in graph_errors(graph, known)}
    for row in _stored():
        known.add(row.name)
        if row.source == "database" and isinstance(row.after, list) and row.after:
            graph[row.name] = row.after
    found = [p for p in graph_errors(graph, known) if str(p) not in alone]
    return _dependency_messages(found, stored=True)


@checks.register()
def check_exactly_once(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """cluster_jobs.E040, W040, W041: a code job with delivery="exactly_once" where the promise
    cannot hold (the ledger is not on the default database), is unbounded (no timeout), or holds
    SQLite's one writer lock longer than EXACTLY_ONCE_SQLITE_SECONDS."""
    from .registry import registry

    jobs = [job for job in registry if job.delivery == "exactly_once"]
    if not jobs or not _settings_readable():
        return []
    alias, found = app_settings.DATABASE, list[checks.CheckMessage]()
    sqlite = vendor_of(alias) == "sqlite"
    longest = app_settings.EXACTLY_ONCE_SQLITE_SECONDS
    for job in jobs:
        if alias != DEFAULT_DB_ALIAS:
            found.append(checks.Error(
                f"Job {job.name!r} is exactly-once, but the ledger is on the database "
                f"{alias!r}: its handler's writes through the default database would commit "
                "apart from its end, so a crash could apply them twice.",
                hint="Keep the ledger on the default database (CLUSTER_JOBS['DATABASE']), or "
                "declare the job delivery='at_least_once' with an idempotent handler.",
                id="cluster_jobs.E040",
            ))  # fmt: skip
        if job.timeout is None:
            found.append(checks.Warning(
                f"Job {job.name!r} is exactly-once without a timeout: a node that freezes "
                "mid-run holds its transaction, and the rows it locked, until the database "
                "drops its session.",
                hint="Give it timeout=timedelta(...): the transaction is then bounded on the "
                "server too (PostgreSQL, MariaDB; not MySQL).",
                id="cluster_jobs.W040",
            ))  # fmt: skip
        elif sqlite and job.timeout.total_seconds() > longest:
            found.append(checks.Warning(
                f"Job {job.name!r} is exactly-once with a timeout of "
                f"{job.timeout.total_seconds():g}s on a SQLite ledger: while it runs, its "
                "transaction holds SQLite's one writer lock, and every other node and job "
                "waits for it, failing once its busy timeout passes.",
                hint="Keep such jobs short (at most CLUSTER_JOBS['EXACTLY_ONCE_SQLITE_SECONDS'], "
                f"{longest:g}s), or run them on PostgreSQL or MariaDB.",
                id="cluster_jobs.W041",
            ))  # fmt: skip
    return found

"""System checks: the exact messages, hints and ids."""

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.core import checks
from django.db import connection
from django.test import override_settings

from django_cluster_jobs import checks as cluster_checks
from django_cluster_jobs.checks import check_settings, check_sqlite_version
from django_cluster_jobs.conf import KNOWN
from django_cluster_jobs.exceptions import shown

SETTINGS_HINT = "Fix the CLUSTER_JOBS setting."
on_sqlite = pytest.mark.skipif(
    connection.vendor != "sqlite", reason=f"needs an SQLite test database, not {connection.vendor}"
)
on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason=f"needs a PostgreSQL test database, not {connection.vendor}",
)


def ours() -> list[checks.CheckMessage]:
    """Every message of this app's registered (non-database) checks, run as Django runs them.

    Only this app's checks run: Django's own model checks query the database on newer
    versions, which these database-free tests must not do.
    """
    from django.core.checks.registry import registry as check_registry

    mine = [c for c in check_registry.get_checks() if c.__module__ == "django_cluster_jobs.checks"]
    return [
        m
        for check in mine
        for m in check(app_configs=None)
        if (m.id or "").startswith("cluster_jobs.")
    ]


def e001(msg: str, hint: str = SETTINGS_HINT) -> checks.Error:
    return checks.Error(msg, hint=hint, id="cluster_jobs.E001")


# -- cluster_jobs.E001 ----------------------------------------------------------------------------


def test_no_errors_with_the_project_settings():
    assert check_settings() == []
    assert check_sqlite_version() == []
    assert ours() == []


@pytest.mark.parametrize("value", [{}, {"COORDINATION": "orm"}, {"COORDINATION": "auto"}])
def test_no_errors_with_defaults_and_valid_choices(value):
    with override_settings(CLUSTER_JOBS=value):
        assert check_settings() == []
        assert ours() == []


def test_unknown_key():
    valid = ", ".join(sorted(KNOWN))
    expected = e001(f"Unknown CLUSTER_JOBS key(s) BOGUS; valid keys are {valid}.")
    with override_settings(CLUSTER_JOBS={"BOGUS": 1, "EXECUTOR_THREADS": 0}):
        assert check_settings() == [expected]
        assert ours() == [expected]


def test_unknown_coordination():
    expected = e001(
        "CLUSTER_JOBS['COORDINATION'] is 'bogus'; choose one of auto, postgresql, sqlite, orm."
    )
    with override_settings(CLUSTER_JOBS={"COORDINATION": "bogus"}):
        assert check_settings() == [expected]
        assert ours() == [expected]


@on_sqlite
def test_postgresql_coordination_on_sqlite():
    expected = e001(
        "CLUSTER_JOBS['COORDINATION'] is 'postgresql' but database 'default' is sqlite; "
        "use 'auto' or 'orm'."
    )
    with override_settings(CLUSTER_JOBS={"COORDINATION": "postgresql"}):
        assert check_settings() == [expected]
        assert ours() == [expected]


@on_postgresql
def test_sqlite_coordination_on_postgresql():
    expected = e001(
        "CLUSTER_JOBS['COORDINATION'] is 'sqlite' but database 'default' is postgresql; "
        "use 'auto' or 'orm'."
    )
    with override_settings(CLUSTER_JOBS={"COORDINATION": "sqlite"}):
        assert check_settings() == [expected]


@pytest.mark.skipif(
    connection.vendor not in ("postgresql", "sqlite"),
    reason=f"{connection.vendor} has no native coordination: the ORM path serves it",
)
def test_native_coordination_on_its_own_database():
    with override_settings(CLUSTER_JOBS={"COORDINATION": connection.vendor}):
        assert check_settings() == []


def test_unknown_database_alias():
    expected = e001(
        "CLUSTER_JOBS is unusable: The connection 'ledger' doesn't exist.",
        hint="Check CLUSTER_JOBS['DATABASE'] names an alias in DATABASES.",
    )
    with override_settings(CLUSTER_JOBS={"DATABASE": "ledger"}):
        assert check_settings() == [expected]


#: What the timing settings must be, as E001 words it.
SECONDS = "a positive number of seconds, at most 2592000 (30 days)"
THREADS = "a whole number, 1 to 1000"
NODE_ID = "None or a non-empty str of at most 200 characters, without NUL"
TAGS = "a list or tuple of at most 100 str, each at most 100 characters"
EPOCH = "an aware datetime from 1970-01-01 to 9000-01-01"
QUEUES = "a dict of queue name (at most 100 characters) to a whole number, 1 to 2147483647"
#: What RUN_LOG_LEVEL must be, as E001 words it.
LEVEL = 'None, a logging level\'s name ("INFO") or a number, 0 or more'


@pytest.mark.parametrize(
    ("key", "value", "expected", "default"),
    [
        ("EXECUTOR_THREADS", 0, THREADS, 4),
        ("EXECUTOR_THREADS", 2.5, THREADS, 4),
        ("EXECUTOR_THREADS", 10**6, THREADS, 4),
        ("CLAIM_BATCH_SIZE", True, "a whole number, 1 to 10000", 500),
        ("CLAIM_BATCH_SIZE", 10**9, "a whole number, 1 to 10000", 500),
        ("LEASE_TTL", -1, SECONDS, 15.0),
        ("LEASE_TTL", float("inf"), SECONDS, 15.0),
        ("HEARTBEAT_INTERVAL", "5", SECONDS, 5.0),
        # A thread's wait cannot take it (OverflowError: the heartbeat thread would die).
        ("HEARTBEAT_INTERVAL", 1e12, SECONDS, 5.0),
        ("POLL_INTERVAL", 0, SECONDS, 1.0),
        ("POLL_INTERVAL", float("nan"), SECONDS, 1.0),
        ("DEAD_AFTER", None, SECONDS, 60.0),
        ("DEAD_AFTER", 10**20, SECONDS, 60.0),
        ("LEADER_TTL", 0.0, SECONDS, 15.0),
        ("RETENTION_DAYS", -3, "a positive number of days, at most 36600", 14.0),
        # timedelta(days=1e9) overflows.
        ("RETENTION_DAYS", 1e9, "a positive number of days, at most 36600", 14.0),
        ("GRACE_PERIOD", -0.5, "a number of seconds, 0 to 2592000 (30 days)", 30.0),
        ("GRACE_PERIOD", float("inf"), "a number of seconds, 0 to 2592000 (30 days)", 30.0),
        ("NODE_ID", "", NODE_ID, None),
        # Longer than WorkerNode.node_id and JobRun.node: the node could not register.
        ("NODE_ID", "n" * 201, NODE_ID, None),
        ("NODE_ID", "node\x00a", NODE_ID, None),
        ("PRESENCE", "no", "True or False", True),
        ("PRESENCE", 0, "True or False", True),
        ("NODE_TAGS", "gpu", TAGS, ()),
        ("NODE_TAGS", ["gpu", 1], TAGS, ()),
        ("NODE_TAGS", ["g" * 101], TAGS, ()),
        ("NODE_TAGS", [f"t{i}" for i in range(101)], TAGS, ()),
        ("QUEUE_LIMITS", {"q" * 101: 1}, QUEUES, {}),
        ("QUEUE_LIMITS", {"reports": 2**31}, QUEUES, {}),
        ("PRIORITY_AGING", float("inf"), "None or seconds, 0 to 316224000", 60.0),
        ("EPOCH", datetime(2026, 1, 1), EPOCH, "EPOCH"),
        ("EPOCH", "1970-01-01", EPOCH, "EPOCH"),
        ("EPOCH", datetime(1, 1, 2, tzinfo=UTC), EPOCH, "EPOCH"),
        ("MAX_PAYLOAD_BYTES", 2**31, "a whole number of bytes, 1 to 2147483647", 64 * 1024),
        (
            "CLOCK",
            "tests.nowhere.Clock",
            "None or the dotted path of an importable clock class",
            None,
        ),
        ("CLOCK", "Clock", "None or the dotted path of an importable clock class", None),
        ("CLOCK", 5, "None or the dotted path of an importable clock class", None),
        ("PROBE_PORT", 70000, "None or a TCP port number, 0 to 65535 (0: any free port)", None),
        ("PROBE_PORT", -1, "None or a TCP port number, 0 to 65535 (0: any free port)", None),
        ("PROBE_PORT", "8001", "None or a TCP port number, 0 to 65535 (0: any free port)", None),
        ("PROBE_PORT", True, "None or a TCP port number, 0 to 65535 (0: any free port)", None),
        ("RUN_LOG_LEVEL", "LOUD", LEVEL, "INFO"),
        ("RUN_LOG_LEVEL", -1, LEVEL, "INFO"),
        ("RUN_LOG_LEVEL", True, LEVEL, "INFO"),
        ("RUN_LOG_MAX_LINES", 0, "a whole number of lines, 1 to 2147483647", 1000),
        ("RUN_LOG_MAX_BYTES", 1.5, "a whole number of bytes, 1 to 2147483647", 256 * 1024),
    ],
)
def test_invalid_value(key, value, expected, default):
    default = cluster_checks.Defaults.EPOCH if default == "EPOCH" else default
    error = e001(
        f"CLUSTER_JOBS[{key!r}] is {shown(value)}; it must be {expected}.",
        hint=f"Fix it, or remove the key to use the default {default!r}.",
    )
    with override_settings(CLUSTER_JOBS={key: value}):
        assert check_settings() == [error]
        assert ours() == [error]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("GRACE_PERIOD", 0),
        ("NODE_ID", "node-a"),
        ("NODE_TAGS", ["gpu", "eu"]),
        ("NODE_TAGS", frozenset({"gpu"})),
        ("NODE_ID", "n" * 200),
        ("LEASE_TTL", 1),
        ("HEARTBEAT_INTERVAL", 2592000),
        ("RETENTION_DAYS", 36600),
        ("EXECUTOR_THREADS", 1000),
        ("QUEUE_LIMITS", {"q" * 100: 2**31 - 1}),
        ("PRIORITY_AGING", 0),
        ("PRESENCE", False),
        ("EPOCH", datetime.fromisoformat("2026-01-01T00:00:00+01:00")),
        ("CLOCK", "django_cluster_jobs.engine.clock.Clock"),
        ("PROBE_PORT", None),
        ("PROBE_PORT", 8001),
        ("PROBE_PORT", 0),
        ("RUN_LOG_LEVEL", None),
        ("RUN_LOG_LEVEL", "warning"),
        ("RUN_LOG_LEVEL", 5),
        ("RUN_LOG_MAX_LINES", 1),
        ("RUN_LOG_MAX_BYTES", 100),
    ],
)
def test_valid_values(key, value):
    with override_settings(CLUSTER_JOBS={key: value}):
        assert check_settings() == []


def test_every_invalid_value_is_reported_with_the_coordination():
    with override_settings(
        CLUSTER_JOBS={"LEASE_TTL": 0, "EXECUTOR_THREADS": 0, "COORDINATION": "bogus"}
    ):
        assert [error.msg for error in check_settings()] == [
            f"CLUSTER_JOBS['EXECUTOR_THREADS'] is 0; it must be {THREADS}.",
            f"CLUSTER_JOBS['LEASE_TTL'] is 0; it must be {SECONDS}.",
            "CLUSTER_JOBS['COORDINATION'] is 'bogus'; choose one of auto, postgresql, sqlite, orm.",
        ]


def test_every_setting_has_a_rule_or_is_checked_by_the_coordinator():
    assert set(cluster_checks.RULES) | {"DATABASE", "COORDINATION"} == KNOWN


# -- cluster_jobs.E002 ----------------------------------------------------------------------------

OLD_SQLITE = SimpleNamespace(sqlite_version="3.31.1", sqlite_version_info=(3, 31, 1))
E002 = checks.Error(
    "SQLite 3.31.1 has no RETURNING clause (the SQLite claim needs it).",
    hint="Upgrade SQLite to 3.35 or newer, or set CLUSTER_JOBS['COORDINATION'] = 'orm'.",
    id="cluster_jobs.E002",
)


@on_sqlite
def test_old_sqlite_is_reported_by_a_plain_check_run(monkeypatch):
    monkeypatch.setattr(cluster_checks, "sqlite3", OLD_SQLITE)
    assert check_sqlite_version() == [E002]
    # Not a database-tagged check: `manage.py check` without --database reports it.
    assert ours() == [E002]
    with override_settings(CLUSTER_JOBS={"COORDINATION": "sqlite"}):
        assert check_sqlite_version() == [E002]


def test_old_sqlite_does_not_matter_on_the_orm_path(monkeypatch):
    monkeypatch.setattr(cluster_checks, "sqlite3", OLD_SQLITE)
    with override_settings(CLUSTER_JOBS={"COORDINATION": "orm"}):
        assert check_sqlite_version() == []


@on_postgresql
def test_old_sqlite_does_not_matter_on_postgresql(monkeypatch):
    monkeypatch.setattr(cluster_checks, "sqlite3", OLD_SQLITE)
    assert check_sqlite_version() == []


def test_old_sqlite_with_broken_settings_leaves_the_report_to_e001(monkeypatch):
    monkeypatch.setattr(cluster_checks, "sqlite3", OLD_SQLITE)
    with override_settings(CLUSTER_JOBS={"BOGUS": 1}):
        assert check_sqlite_version() == []


def test_checks_are_registered_without_the_database_tag():
    registered = checks.registry.registry.get_checks()
    assert check_settings in registered
    assert check_sqlite_version in registered
    assert checks.Tags.database not in check_settings.tags
    assert checks.Tags.database not in check_sqlite_version.tags


# -- W002, W003 -------------------------------------------------------------------------------

from django_cluster_jobs.checks import (  # noqa: E402
    check_stored_definitions,
    check_timings,
)


@pytest.mark.django_db  # Django 6.1's own model checks read the database's JSON support
def test_w001_is_retired_and_reported_for_no_retention(settings):
    """Retention no longer bounds correctness (each job's mark does), so nothing warns of it."""
    settings.CLUSTER_JOBS = {**settings.CLUSTER_JOBS, "RETENTION_DAYS": 0.00001}
    ids = {message.id for message in checks.run_checks(include_deployment_checks=True)}
    assert "cluster_jobs.W001" not in ids


def test_w002_lease_shorter_than_two_heartbeats(settings):
    settings.CLUSTER_JOBS = {
        **settings.CLUSTER_JOBS,
        "HEARTBEAT_INTERVAL": 5,
        "LEASE_TTL": 6,
        "LEADER_TTL": 15,
        "DEAD_AFTER": 60,
    }
    assert check_timings() == [
        checks.Warning(
            "CLUSTER_JOBS['LEASE_TTL'] (6s) is shorter than two heartbeats (HEARTBEAT_INTERVAL "
            "is 5s): one late heartbeat loses it.",
            hint="Make LEASE_TTL at least 10s, or beat more often.",
            id="cluster_jobs.W002",
        )
    ]


def test_w002_silent_for_the_defaults(settings):
    settings.CLUSTER_JOBS = {}
    assert check_timings() == []


@pytest.mark.django_db
def test_w003_stored_definition_naming_an_unregistered_callable():
    """It was the error E003, which blocked migrate and the scheduler; E003 is retired."""
    from tests.factories import JobDefinitionFactory

    JobDefinitionFactory(name="orphan", callable_name="gone.job")
    JobDefinitionFactory(name="fine", callable_name="tests.manual")
    assert check_stored_definitions() == [
        checks.Warning(
            "Job 'orphan' is orphaned: its callable 'gone.job' is not registered, so no node "
            "runs it.",
            hint="Point it at a registered job in the admin, or delete it there.",
            id="cluster_jobs.W003",
        )
    ]


# -- cluster_jobs.E005 ----------------------------------------------------------------------------


def e005(mode: object) -> checks.Error:
    return checks.Error(
        f"The ledger database 'default' is SQLite with transaction_mode {mode!r}: a write that "
        "starts as a read cannot wait for the lock, so nodes fail with 'database is locked'.",
        hint="Add \"transaction_mode\": \"IMMEDIATE\" to DATABASES['default']['OPTIONS'] "
        '(with a busy timeout), e.g. "OPTIONS": {"transaction_mode": "IMMEDIATE", '
        '"timeout": 20}.',
        id="cluster_jobs.E005",
    )


@on_sqlite
@pytest.mark.parametrize("options", [{}, {"transaction_mode": "DEFERRED"}, {"timeout": 20}])
def test_sqlite_without_immediate_transactions_is_an_error(monkeypatch, options):
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    mode = options.get("transaction_mode")
    assert [m for m in ours() if m.id == "cluster_jobs.E005"] == [e005(mode)]


@on_sqlite
@pytest.mark.parametrize("mode", ["IMMEDIATE", "immediate"])
def test_sqlite_with_immediate_transactions_passes(monkeypatch, mode):
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {"transaction_mode": mode})
    assert [m for m in ours() if m.id == "cluster_jobs.E005"] == []


@on_postgresql
def test_postgresql_needs_no_transaction_mode():
    assert [m for m in ours() if m.id == "cluster_jobs.E005"] == []

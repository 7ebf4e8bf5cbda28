"""The checks of what the ledger database can enforce: exact messages, on faked features and on
the database this run uses."""

import pytest
from django.core import checks
from django.db import connection
from django.test import override_settings

from django_cluster_jobs.dbchecks import LANE_HINT, PARTIAL_HINT, ZONES_HINT, check_database

pytestmark = pytest.mark.django_db


def features(monkeypatch, *, nulls=True, zones=True, partial=True) -> str:
    """Fake what the test database can do; return the name its messages give it."""
    monkeypatch.setattr(connection.features, "supports_nullable_unique_constraints", nulls)
    monkeypatch.setattr(connection.features, "has_zoneinfo_database", zones)
    monkeypatch.setattr(connection.features, "supports_partial_indexes", partial)
    return connection.display_name


def test_a_database_that_enforces_everything_gets_no_message(monkeypatch):
    features(monkeypatch)
    assert check_database(["default"]) == []


def test_a_unique_index_with_a_single_null_cannot_hold_the_lane(monkeypatch):
    name = features(monkeypatch, nulls=False)
    assert check_database(["default"]) == [
        checks.Error(
            f"The ledger database 'default' ({name}) lets a unique index hold one NULL only: "
            "the lane of a job that allows no overlap (a unique index over the lane of live "
            "runs, NULL for every other run) cannot be enforced.",
            hint=LANE_HINT,
            id="cluster_jobs.E030",
        )
    ]


def test_missing_time_zone_definitions_are_a_warning_when_time_zones_are_used(monkeypatch):
    name = features(monkeypatch, zones=False)
    assert check_database(["default"]) == [
        checks.Warning(
            f"The ledger database 'default' ({name}) has no time zone definitions: dates it "
            "converts to a time zone (the admin's, in the current time zone) come back empty "
            "and the pages that show them fail.",
            hint=ZONES_HINT,
            id="cluster_jobs.W030",
        )
    ]
    with override_settings(USE_TZ=False):
        assert check_database(["default"]) == []


def test_indexes_created_whole_are_explained_not_hidden(monkeypatch):
    name = features(monkeypatch, partial=False)
    assert check_database(["default"]) == [
        checks.Info(
            f"{name} has no partial indexes: the ledger's indexes with a condition "
            "(models.W037 on cluster_jobs.JobRun) are created whole. They only speed up "
            "queries; no guarantee depends on one.",
            hint=PARTIAL_HINT,
            id="cluster_jobs.I030",
        )
    ]


def test_the_checks_run_only_for_the_ledger_database(monkeypatch):
    features(monkeypatch, nulls=False, zones=False, partial=False)
    assert check_database(None) == [] and check_database(["other"]) == []


def test_no_guarantee_of_the_ledger_depends_on_a_partial_unique_constraint():
    """models.W036 (a unique constraint with a condition, not created without partial indexes)
    is never raised for this app's models, on the database this run uses."""
    found = checks.run_checks(databases=["default"], include_deployment_checks=False)
    ours = [m for m in found if m.id == "models.W036" and "cluster_jobs" in str(m.obj)]
    assert ours == []
    expected = set() if connection.features.supports_partial_indexes else {"cluster_jobs.I030"}
    assert {m.id for m in found if (m.id or "").startswith("cluster_jobs.")} == expected

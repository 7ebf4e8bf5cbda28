"""The CLUSTER_JOBS setting: defaults, overrides, unknown keys and the node id."""

import os
import socket
from datetime import UTC, datetime

import pytest
from django.conf import settings
from django.core import exceptions as django_exceptions
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_cluster_jobs.conf import KNOWN, Defaults, app_settings
from django_cluster_jobs.exceptions import ClusterJobsError, ImproperlyConfigured

DEFAULTS = {
    "NODE_ID": None,
    "NODE_TAGS": (),
    "EXECUTOR_THREADS": 4,
    "CLAIM_BATCH_SIZE": 500,
    "GRACE_PERIOD": 30.0,
    "POLL_INTERVAL": 1.0,
    "DATABASE": "default",
    "COORDINATION": "auto",
    "PRESENCE": True,
    "LEASE_TTL": 15.0,
    "HEARTBEAT_INTERVAL": 5.0,
    "DEAD_AFTER": 60.0,
    "LEADER_TTL": 15.0,
    "RETENTION_DAYS": 14.0,
    "CLOCK": None,
    "EPOCH": datetime(1970, 1, 1, tzinfo=UTC),
    "PRIORITY_AGING": 60.0,
    "QUEUE_LIMITS": {},
    "MAX_PAYLOAD_BYTES": 65536,
    "EXACTLY_ONCE_SQLITE_SECONDS": 5.0,
    "PROBE_PORT": None,
    "RUN_LOG_LEVEL": "INFO",
    "RUN_LOG_MAX_LINES": 1000,
    "RUN_LOG_MAX_BYTES": 256 * 1024,
}


def test_known_keys_are_the_documented_defaults():
    assert frozenset(DEFAULTS) == KNOWN
    assert {key: getattr(Defaults, key) for key in KNOWN} == DEFAULTS


@pytest.mark.parametrize("value", [{}, None])
def test_defaults_when_nothing_is_set(value):
    with override_settings(CLUSTER_JOBS=value):
        assert {key: getattr(app_settings, key) for key in KNOWN} == DEFAULTS


def test_defaults_without_the_setting_at_all():
    with override_settings():
        del settings.CLUSTER_JOBS
        app_settings.clear()  # deleting a setting sends no setting_changed signal
        try:
            assert {key: getattr(app_settings, key) for key in KNOWN} == DEFAULTS
        finally:
            app_settings.clear()


def test_values_come_from_the_project_settings():
    for key, value in settings.CLUSTER_JOBS.items():
        assert getattr(app_settings, key) == value
    assert DEFAULTS["RETENTION_DAYS"] == app_settings.RETENTION_DAYS  # not set by the project


def test_override_settings_is_picked_up_and_reset_afterwards():
    before = app_settings.LEASE_TTL
    with override_settings(CLUSTER_JOBS={"LEASE_TTL": 7.5, "NODE_TAGS": ("gpu",)}):
        assert app_settings.LEASE_TTL == 7.5
        assert app_settings.NODE_TAGS == ("gpu",)
        assert DEFAULTS["EXECUTOR_THREADS"] == app_settings.EXECUTOR_THREADS
        with override_settings(CLUSTER_JOBS={"LEASE_TTL": 9}):
            assert app_settings.LEASE_TTL == 9
        assert app_settings.LEASE_TTL == 7.5
    assert before == app_settings.LEASE_TTL
    assert settings.CLUSTER_JOBS.get("NODE_TAGS", ()) == app_settings.NODE_TAGS


@override_settings(CLUSTER_JOBS={"CLAIM_BATCH_SIZE": 3})
def test_override_settings_as_a_decorator():
    assert app_settings.CLAIM_BATCH_SIZE == 3


def test_unknown_key_names_the_key_and_the_valid_ones():
    typo = {"LEASE_TTL": 1.0, "LEASE_TIL": 2.0, "EXTRA": 1}
    with override_settings(CLUSTER_JOBS=typo), pytest.raises(ImproperlyConfigured) as caught:
        app_settings.LEASE_TTL  # noqa: B018
    assert str(caught.value) == (
        "Unknown CLUSTER_JOBS key(s) EXTRA, LEASE_TIL; "
        f"valid keys are {', '.join(sorted(DEFAULTS))}."
    )
    assert settings.CLUSTER_JOBS["LEASE_TTL"] == app_settings.LEASE_TTL  # reset afterwards


def test_an_unknown_key_is_djangos_improperly_configured_too():
    with (
        override_settings(CLUSTER_JOBS={"EXTRA": 1}),
        pytest.raises(
            django_exceptions.ImproperlyConfigured, match="Unknown CLUSTER_JOBS key"
        ) as caught,
    ):
        app_settings.LEASE_TTL  # noqa: B018
    assert isinstance(caught.value, ImproperlyConfigured)
    assert isinstance(caught.value, ClusterJobsError)


def test_node_id_setting_wins(monkeypatch):
    monkeypatch.setenv("POD_NAME", "web-7f9c")
    with override_settings(CLUSTER_JOBS={"NODE_ID": "node-a"}):
        assert app_settings.node_id() == "node-a"


def test_node_id_defaults_to_the_pod_name_and_pid(monkeypatch):
    monkeypatch.setenv("POD_NAME", "web-7f9c")
    monkeypatch.setattr(socket, "gethostname", lambda: "host-a")
    with override_settings(CLUSTER_JOBS={}):
        assert app_settings.node_id() == f"web-7f9c:{os.getpid()}"


@pytest.mark.parametrize("pod_name", [None, ""])
def test_node_id_falls_back_to_the_host_name_and_pid(monkeypatch, pod_name):
    if pod_name is None:
        monkeypatch.delenv("POD_NAME", raising=False)
    else:
        monkeypatch.setenv("POD_NAME", pod_name)
    monkeypatch.setattr(socket, "gethostname", lambda: "host-a")
    with override_settings(CLUSTER_JOBS={}):
        assert app_settings.node_id() == f"host-a:{os.getpid()}"


def test_a_node_id_made_from_a_long_pod_name_fits_its_column(monkeypatch):
    # A pod name may have 253 characters; the node id columns hold 200.
    monkeypatch.setenv("POD_NAME", "p" * 253)
    with override_settings(CLUSTER_JOBS={}):
        made = app_settings.node_id()
    assert len(made) == 200
    assert made.endswith(f"p:{os.getpid()}")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--threads", "0", "must be a whole number, 1 to 1000"),
        ("--threads", "100000", "must be a whole number, 1 to 1000"),
        ("--node-id", "n" * 201, "must be None or a non-empty str of at most 200 characters"),
        ("--tags", "t" * 101, "each at most 100 characters"),
        ("--tags", ",".join(f"t{i}" for i in range(101)), "at most 100 str"),
        ("--duration", "1e12", "must be a number of seconds, 0 to 2592000 (30 days)"),
        ("--duration", "inf", "must be a number of seconds, 0 to 2592000 (30 days)"),
        ("--duration", "nan", "must be a number of seconds, 0 to 2592000 (30 days)"),
        ("--duration", "-1", "must be a number of seconds, 0 to 2592000 (30 days)"),
    ],
)
def test_runscheduler_refuses_an_option_its_setting_could_not_take(option, value, message):
    # Refused as the command line is read: before a node starts, with the reason.
    with pytest.raises(CommandError) as refused:
        call_command("runscheduler", f"{option}={value}")
    assert option in str(refused.value)
    assert message in str(refused.value)

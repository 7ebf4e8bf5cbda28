"""Every door, fed generated input: each value is refused with an error naming its field, or
accepted, and what a door accepted is stored and passes ``row_errors`` (one validator: no door
accepts what another refuses).

Each ``through_*`` helper returns what its door accepted, as stored (a JobDefinition reloaded
from the database, or a JobRun), or None when the door refused it; a test can go on to plan and
run what they return on a real node.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils.duration import duration_string
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from django_cluster_jobs import ImproperlyDeclared, job, registry
from django_cluster_jobs.admin.forms import JobDefinitionForm
from django_cluster_jobs.models import JobDefinition, JobRun
from django_cluster_jobs.validation import COLUMNS, check_run_inputs, row_errors
from tests.factories import JobDefinitionFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("registry_restored")]

EXAMPLES = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: Names the decorator's errors may give as the field: its options and what they make.
DECLARATION_FIELDS = {*COLUMNS, "callable", "schedule", "tz", "every", "delay", "dont_retry"}


def handler(value: int = 0, label: str = "") -> str:
    """The code every generated declaration runs."""
    return f"{label}{value}"


@contextmanager
def rolled_back() -> Iterator[None]:
    """Keep one example's rows from the next (the test's own transaction holds them all)."""
    from django.db import transaction

    with transaction.atomic():
        yield
        transaction.set_rollback(True)


# -- what the strategies draw: valid values, values just past a bound, and anything ------------

text = st.text(max_size=12) | st.sampled_from(["", "a" * 201, "nul\x00", "lone\ud800", "é.x"])
odd = st.none() | st.booleans() | st.integers() | st.floats() | text | st.binary(max_size=3)
durations = st.timedeltas(min_value=timedelta(days=-1), max_value=timedelta(days=4000))
short = st.integers(1, 86_400).map(lambda seconds: timedelta(seconds=seconds))
counts = st.integers(min_value=-5, max_value=2**33) | st.sampled_from([1, 100, 101, 10_001])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(max_value=2**70) | st.floats() | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
payloads = st.dictionaries(st.sampled_from(["value", "label", "nope"]) | text, json_values,
                           max_size=3) | json_values  # fmt: skip
backoffs = st.dictionaries(
    st.sampled_from(["kind", "base", "factor", "cap", "retries"]),
    st.sampled_from(["fixed", "exponential", "exponential_jitter", "linear"])
    | st.floats() | st.integers(min_value=-1, max_value=10**9),
    max_size=4,
) | odd  # fmt: skip
crons = st.sampled_from(
    ["0 9 * * *", "*/5 * * * * *", "61 * * * *", "@daily", "R * * * *", "0 0 30 2 *"]
) | text  # fmt: skip
zones = st.sampled_from(["UTC", "Europe/Paris", "Mars/Olympus", "Europe", "../etc"]) | text


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """Draw from ``bad`` one time in five, so that many examples pass every door."""
    return st.integers(0, 4).flatmap(lambda n: bad if n == 0 else good)


def choice(*valid: str) -> st.SearchStrategy:
    return mostly(st.sampled_from(valid), text)


OPTIONS = {
    "name": mostly(st.from_regex(r"\Aprop\.[a-z0-9_.:-]{1,12}\Z"), text.map("prop.{}".format)),
    "placement": choice("cluster", "every_node"),
    "delivery": choice("at_least_once", "at_most_once"),
    "overlap": choice("skip", "allow", "buffer_one", "cancel_other"),
    "misfire": choice("fire_once", "skip", "run_all"),
    "catch_up_window": st.none() | durations,
    "catch_up_limit": mostly(st.integers(1, 100), counts),
    "max_attempts": mostly(st.integers(1, 100), counts | odd),
    "backoff": mostly(st.fixed_dictionaries({}, optional={"base": st.integers(0, 60)}), backoffs),
    "breaker_threshold": st.none() | counts,
    "breaker_cooldown": st.none() | durations,
    "timeout": mostly(st.none() | short, durations | odd),
    "executor": choice("thread", "process"),
    "priority": mostly(st.integers(-100, 100), counts.map(lambda n: n - 100) | odd),
    "queue": choice("default", "reports"),
    "max_concurrency": st.none() | counts,
    "requires": mostly(
        st.none() | st.sets(st.sampled_from(["gpu", "eu"])),
        st.lists(text, max_size=3) | st.sets(text, max_size=2) | odd,
    ),
    "payload": mostly(st.fixed_dictionaries({}, optional={"value": st.integers()}), payloads),
    "enabled": mostly(st.booleans(), odd),
}


#: One schedule, mostly; sometimes any mix of the schedule options, valid or not.
SCHEDULES = mostly(
    st.one_of(
        st.fixed_dictionaries({"cron": st.sampled_from(["0 9 * * *", "*/5 * * * * *"])},
                              optional={"tz": st.just("Europe/Paris")}),
        st.fixed_dictionaries({"every": short}),
        st.fixed_dictionaries({"delay": short}),
        st.fixed_dictionaries({"startup": st.just(True)}),
        st.just({}),
    ),
    st.fixed_dictionaries({}, optional={"cron": crons, "tz": zones, "every": durations | odd,
                                        "delay": durations | odd, "startup": st.booleans()}),
)  # fmt: skip


# -- the doors ---------------------------------------------------------------------------------


def through_decorator(options: dict[str, Any]) -> JobDefinition | None:
    """Declare a job with ``options``; return its stored definition, None if it was refused."""
    try:
        declared = job(**{"name": "prop.job", **options})(handler)
    except ImproperlyDeclared as exc:
        assert exc.field in DECLARATION_FIELDS, exc
        return None
    row = JobDefinition.objects.create(
        name=declared.name, enabled=declared.enabled, **declared.definition_fields()
    )
    return JobDefinition.objects.get(pk=row.pk)


def form_value(value: Any) -> Any:
    """How a browser would post a column's value."""
    if isinstance(value, timedelta):
        return duration_string(value)
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, bool):
        return "on" if value else None
    return "" if value is None else str(value)


def through_form(data: dict[str, Any]) -> JobDefinition | None:
    """Post ``data`` to the admin's job form; return the stored definition, None if refused."""
    form = JobDefinitionForm(data={k: v for k, v in data.items() if v is not None})
    if not form.is_valid():
        assert set(form.errors) <= set(form.fields), form.errors
        return None
    return JobDefinition.objects.get(pk=form.save().pk)


def through_api(client: APIClient, body: str) -> JobRun | None:
    """Post the JSON ``body`` to the enqueue action; return the stored run, None if refused."""
    path = reverse("cluster_jobs_api:job-enqueue", args=["report"])
    response = client.post(path, body, content_type="application/json")
    if response.status_code == 400:
        assert set(response.json()) <= {"payload", "priority", "run_at", "idempotency_key"}
        return None
    assert response.status_code == 201, response.content
    return JobRun.objects.get(pk=response.json()["id"])


def form_of(row: JobDefinition) -> JobDefinitionForm:
    """The admin's form for ``row``, posted back with the row's own values."""
    fields = JobDefinitionForm(instance=row).fields
    data = {name: form_value(getattr(row, name)) for name in fields}
    return JobDefinitionForm(instance=row, data={k: v for k, v in data.items() if v is not None})


def through_row(values: dict[str, Any]) -> JobDefinition | None:
    """Store a row with ``values`` as SQL could; return it reloaded, None if no column holds it."""
    from django.db import DatabaseError, transaction

    try:
        with transaction.atomic():
            row = JobDefinitionFactory.build(name="prop.row", **values)
            row.save()
    except (DatabaseError, ValueError, TypeError, OverflowError, UnicodeError):
        return None
    return JobDefinition.objects.get(pk=row.pk)


# -- the properties ----------------------------------------------------------------------------


@EXAMPLES
@given(st.fixed_dictionaries({}, optional=OPTIONS), SCHEDULES)
def test_a_declaration_is_refused_naming_its_field_or_stored_usable(options, schedule):
    with rolled_back():
        stored = through_decorator({**options, **schedule})
        event("accepted" if stored is not None else "refused")
        if stored is not None:
            assert row_errors(stored) == []


FORM = {
    "name": OPTIONS["name"],
    "callable_name": mostly(st.just("tests.manual"), st.sampled_from(["tests.boom", "gone"]) | odd),
    "source": choice("database", "code"),
    "schedule_kind": choice("cron", "every", "delay", "startup", "on_demand"),
    "cron": mostly(st.sampled_from(["0 9 * * *", "*/5 * * * * *"]), crons),
    "timezone": mostly(st.just("Europe/Paris"), zones),
    "interval": mostly(short, st.none() | durations),
    "placement": OPTIONS["placement"],
    "overlap": OPTIONS["overlap"],
    "catch_up_window": mostly(st.none() | short, durations),
    "catch_up_limit": OPTIONS["catch_up_limit"],
    "max_attempts": mostly(st.integers(1, 100), counts),
    "backoff": OPTIONS["backoff"],
    "breaker_threshold": mostly(st.none(), counts),
    "breaker_cooldown": mostly(short, st.none() | durations),
    "timeout": mostly(st.none() | short, durations),
    "executor": OPTIONS["executor"],
    "priority": OPTIONS["priority"],
    "queue": OPTIONS["queue"],
    "requires": mostly(st.lists(st.sampled_from(["gpu", "eu"]), max_size=2), odd),
    "payload": OPTIONS["payload"],
    "pause_reason": mostly(st.text(max_size=20), text),
}
FORM_DEFAULTS = {"name": "prop.form", "callable_name": "tests.manual", "source": "database",
                 "schedule_kind": "on_demand", "timezone": "UTC", "placement": "cluster",
                 "delivery": "at_least_once", "overlap": "skip", "misfire": "fire_once",
                 "catch_up_limit": "10", "max_attempts": "1", "executor": "thread",
                 "priority": "0", "queue": "default", "backoff": "{}", "requires": "[]",
                 "payload": "{}", "enabled": "on"}  # fmt: skip


@EXAMPLES
@given(st.fixed_dictionaries({}, optional=FORM))
def test_admin_form_data_is_refused_on_its_field_or_stored_usable(changes):
    data = {**FORM_DEFAULTS, **{k: form_value(v) for k, v in changes.items()}}
    with rolled_back():
        stored = through_form(data)
        event("accepted" if stored is not None else "refused")
        if stored is not None:
            assert row_errors(stored) == []


when = st.datetimes(datetime(1960, 1, 1), datetime(9100, 1, 1), timezones=st.just(UTC))
BODY = {
    "payload": OPTIONS["payload"],
    "priority": OPTIONS["priority"],
    "run_at": mostly(when.map(datetime.isoformat), text),
    "idempotency_key": mostly(st.none() | st.from_regex(r"\A[a-z0-9-]{1,20}\Z"), text),
}


@settings(parent=EXAMPLES, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries({}, optional=BODY))
def test_an_api_body_is_refused_naming_its_field_or_stored_usable(admin_user, body):
    try:  # as a client would send it: escaped to ASCII, so a lone surrogate gets through
        text = json.dumps(body, allow_nan=False)
    except (TypeError, ValueError):  # bytes, NaN: no JSON body holds them
        assume(False)
    client = APIClient()
    client.force_authenticate(admin_user)
    with rolled_back():
        JobDefinitionFactory(name="report")
        run = through_api(client, text)
        event("accepted" if run is not None else "refused")
        if run is not None:
            check_run_inputs(
                "report", payload=run.payload, priority=run.priority, at=run.due_at,
                handler=registry.get("tests.manual"),
            )  # fmt: skip


ROW = {
    "callable_name": FORM["callable_name"],
    "schedule_kind": FORM["schedule_kind"],
    "cron": crons,
    "timezone": zones,
    "interval": st.none() | durations,
    "executor": OPTIONS["executor"],
    "catch_up_window": st.none() | durations,
    "max_attempts": st.integers(min_value=0, max_value=2**31 - 1),
    "priority": st.integers(min_value=-(2**31), max_value=2**31 - 1),
    "queue": text,
    "backoff": json_values,
    "requires": json_values,
    "payload": json_values,
    "breaker_threshold": st.none() | st.integers(min_value=0, max_value=2**31 - 1),
}


@EXAMPLES
@given(st.fixed_dictionaries({}, optional=ROW))
def test_a_stored_row_is_reported_naming_its_field_and_never_raises(values):
    with rolled_back():
        stored = through_row(values)
        event("stored" if stored is not None else "no column holds it")
        if stored is None:
            return
        problems = row_errors(stored)
        for problem in problems:
            assert problem.job == "prop.row" and problem.field in COLUMNS, problem
        form = form_of(stored)
        assert form.is_valid() == (not problems), (problems, form.errors)

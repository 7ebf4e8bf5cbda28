"""The validator itself: its bounds, what it says, and that it never raises."""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_cluster_jobs import bounds, validation
from django_cluster_jobs.exceptions import ImproperlyDeclared, InvalidPayload, shown
from django_cluster_jobs.models import (
    Delivery,
    JobDefinition,
    JobRun,
    Misfire,
    Overlap,
    Placement,
    ScheduleKind,
    Source,
)
from django_cluster_jobs.policies.retry import Backoff
from django_cluster_jobs.registry import registry
from django_cluster_jobs.validation import (
    COLUMNS,
    check_run_inputs,
    definition_errors,
    row_errors,
)

# -- the bounds match the columns, and keep the engine's arithmetic safe -------------------------


def test_lengths_are_the_columns():
    length = {f.name: f.max_length for f in JobDefinition._meta.fields if f.max_length}
    assert validation.NAME_MAX_LENGTH == length["name"] == length["callable_name"]
    assert length["cron"] == validation.CRON_MAX_LENGTH
    assert length["timezone"] == validation.TIMEZONE_MAX_LENGTH
    assert length["queue"] == validation.QUEUE_MAX_LENGTH
    assert length["pause_reason"] == validation.PAUSE_REASON_MAX_LENGTH
    longest_prefix = max(len(value) for value, _ in JobRun._meta.get_field("outcome").choices)
    assert (
        validation.KEY_MAX_LENGTH + longest_prefix + 1 <= JobRun._meta.get_field("key").max_length
    )


def test_choices_are_the_models():
    assert tuple(ScheduleKind.values) == bounds.SCHEDULE_KINDS
    assert tuple(Source.values) == bounds.SOURCES
    assert tuple(Placement.values) == bounds.PLACEMENTS
    assert tuple(Delivery.values) == bounds.DELIVERIES
    assert tuple(Overlap.values) == bounds.OVERLAPS
    assert tuple(Misfire.values) == bounds.MISFIRES


def test_every_column_has_a_rule():
    editable = [
        f.name for f in JobDefinition._meta.concrete_fields if f.editable and not f.primary_key
    ]
    assert [name for name in editable if name in COLUMNS] == list(COLUMNS)
    assert set(editable) - set(COLUMNS) <= {"created_at", "updated_at", "settled_through"}


def test_twice_the_longest_duration_fits_around_every_run_time():
    longest = max(validation.MAX_INTERVAL, validation.MAX_WINDOW, validation.MAX_COOLDOWN)
    assert (validation.LATEST_RUN_AT + 2 * longest).year < 9999
    assert (validation.EARLIEST_RUN_AT - 2 * longest).year > 1
    assert (datetime(9000, 12, 31, tzinfo=UTC) + 2 * longest).year < 9999


def test_the_longest_timeout_fits_a_thread_timer_on_every_platform():
    windows_timeout_max = 4294967.0
    assert validation.MAX_TIMEOUT.total_seconds() < min(threading.TIMEOUT_MAX, windows_timeout_max)


def test_the_largest_backoff_stays_a_finite_float():
    worst = validation.BACKOFF_SECONDS_MAX * float(validation.BACKOFF_FACTOR_MAX) ** (
        validation.MAX_ATTEMPTS - 1
    )
    assert math.isfinite(worst)
    policy = Backoff("exponential", validation.BACKOFF_SECONDS_MAX, 100, 60)
    assert policy.delay(validation.MAX_ATTEMPTS) == timedelta(seconds=60)


def test_priorities_and_counts_fit_postgresql_integers():
    assert -(2**31) <= validation.PRIORITY_MIN < 0 < validation.PRIORITY_MAX < 2**31
    assert validation.COUNT_MAX == 2**31 - 1


def test_backoff_past_any_bound_never_overflows():
    assert Backoff("exponential", 1.0, 10.0**300, 5.0).delay(10) == timedelta(seconds=5)
    assert Backoff("exponential", 1, 10**400, 5).delay(3) == timedelta(seconds=5)


def test_backoff_from_dict_uses_the_validator():
    with pytest.raises(ImproperlyDeclared, match="its factor must be a number"):
        Backoff.from_dict("unit.job", {"factor": 10**6})
    assert Backoff.from_dict("unit.job", {"kind": "fixed", "base": 3}) == Backoff("fixed", 3)


# -- what it says ------------------------------------------------------------------------------


def test_a_huge_value_is_shortened_in_the_message():
    assert shown("x" * 10) == repr("x" * 10)
    text = shown("x" * 10_000)
    assert len(text) < 160 and text.endswith("(10002 characters)")


def test_a_value_whose_repr_fails_is_named_by_its_type():
    class Odd:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert shown(Odd()) == "<Odd object>"
    [problem] = definition_errors({"queue": Odd()}, job="unit.job")
    assert "<Odd object>" in str(problem)


def test_definition_errors_lists_every_problem_in_column_order():
    problems = definition_errors(
        {"queue": "", "priority": 500, "name": "a b", "interval": timedelta(days=-1)},
        job="unit.job",
    )
    assert [p.field for p in problems] == ["name", "interval", "priority", "queue"]
    assert all(p.job == "unit.job" for p in problems)


def test_only_the_given_columns_are_checked():
    assert definition_errors({}, job="unit.job") == []
    assert definition_errors({"schedule_kind": "every"}, job="unit.job") == []
    assert definition_errors({"id": 5, "created_at": None, "unknown": []}, job="unit.job") == []


def test_a_non_mapping_is_one_problem():
    for values in (None, [("name", "x")], "name=x", 5):
        [problem] = definition_errors(values, job="unit.job")  # type: ignore[arg-type]
        assert problem.field == "definition"


def test_check_run_inputs_returns_the_payload_as_stored():
    assert check_run_inputs("unit.job", payload={"items": (1, 2), "n": None}) == {
        "items": [1, 2],
        "n": None,
    }
    assert check_run_inputs("unit.job") == {}


@pytest.mark.parametrize(
    ("inputs", "field"),
    [({"priority": 101}, "priority"), ({"key": "k" * 201}, "key"),
     ({"at": datetime(2030, 1, 1)}, "at"), ({"at": datetime(1, 1, 1, tzinfo=UTC)}, "at"),
     ({"payload": [1]}, "payload"), ({"payload": {"a": float("nan")}}, "payload")],
)  # fmt: skip
def test_check_run_inputs_names_the_field(inputs, field):
    with pytest.raises(ImproperlyDeclared) as caught:
        check_run_inputs("unit.job", **inputs)
    assert (caught.value.job, caught.value.field) == ("unit.job", field)
    if field == "payload":
        assert isinstance(caught.value, InvalidPayload)


def test_the_payload_cap_is_a_setting(settings):
    settings.CLUSTER_JOBS = {**settings.CLUSTER_JOBS, "MAX_PAYLOAD_BYTES": 20}
    assert check_run_inputs("unit.job", payload={"a": "x" * 5}) == {"a": "xxxxx"}
    with pytest.raises(InvalidPayload, match=r"takes 21 bytes as JSON, more than .*\(20\)"):
        check_run_inputs("unit.job", payload={"a": "x" * 12})


# -- stored rows (item 2: the error names the job, never '?') ------------------------------------


def stored(**fields) -> JobDefinition:
    """An unsaved row as a node would load it: any value a database column can hold."""
    return JobDefinition(**{"name": "ops.nightly", "callable_name": "tests.manual", **fields})


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [({"schedule_kind": "cron", "cron": "61 * * * *"}, "cron", "not a valid cron expression"),
     ({"schedule_kind": "cron", "cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "timezone",
      "IANA"),
     ({"schedule_kind": "cron", "cron": "0 9 * * *", "timezone": "Europe"}, "timezone", "IANA"),
     ({"schedule_kind": "every", "interval": None}, "interval", "needs an interval"),
     ({"schedule_kind": "every", "interval": timedelta(days=3_000_000)}, "interval", "at most"),
     ({"payload": [1, 2]}, "payload", "must be a dict"),
     ({"payload": {"nope": 1}}, "payload", "unexpected keyword argument 'nope'"),
     ({"requires": {"gpu": 1}}, "requires", "as strings"),
     ({"backoff": [1]}, "backoff", "dict"),
     ({"priority": 2**40}, "priority", "from -100 to 100"),
     ({"executor": "celery"}, "executor", "thread, process"),
     ({"catch_up_window": timedelta(days=999_999)}, "catch_up_window", "at most")],
)  # fmt: skip
def test_row_errors_name_the_job_and_the_field(fields, field, says):
    [problem] = row_errors(stored(**fields))
    assert (problem.job, problem.field) == ("ops.nightly", field)
    assert says in str(problem) and "'?'" not in str(problem)


def test_a_usable_row_has_no_problem():
    assert row_errors(stored(schedule_kind="cron", cron="0 9 * * mon-fri")) == []


def test_a_breaker_threshold_alone_is_usable_with_the_default_cooldown():
    """As with the decorator, a threshold without a cooldown pauses for the default (5 min):
    refusing such a row would stop a job that stored data already had running."""
    assert row_errors(stored(breaker_threshold=3, breaker_cooldown=None)) == []


def test_an_orphaned_row_says_so_first():
    problems = row_errors(stored(callable_name="gone.job", source="code", priority=500))
    assert [p.field for p in problems] == ["callable_name", "priority"]
    assert "orphaned" in problems[0].hint and "delete it in the admin" in problems[0].hint


def test_row_errors_of_something_that_is_not_a_row():
    [problem] = row_errors(object())  # type: ignore[arg-type]
    assert problem.field == "definition"


# -- never raises --------------------------------------------------------------------------------

#: Any value at all: what a caller, a form or a database could hand the validator.
anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary()
    | st.timedeltas() | st.datetimes() | st.datetimes(timezones=st.just(UTC)) | st.just(object()),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3)
    | st.tuples(inner) | st.frozensets(st.integers()),
    max_leaves=10,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(COLUMNS), anything))
def test_definition_errors_never_raises(values):
    handler = registry.get("tests.manual")
    for problem in definition_errors(values, job="unit.job", handler=handler):
        assert isinstance(problem, ImproperlyDeclared)
        assert problem.job == "unit.job" and problem.field in (*COLUMNS, "definition")
        assert str(problem)


@settings(max_examples=200, deadline=None)
@given(payload=anything, priority=anything, key=anything, at=anything)
def test_check_run_inputs_raises_only_what_it_documents(payload, priority, key, at):
    try:
        cleaned = check_run_inputs("unit.job", payload=payload, priority=priority, key=key, at=at)
    except ImproperlyDeclared as exc:
        assert exc.field in ("payload", "priority", "key", "at")
    else:
        assert isinstance(cleaned, dict)


@pytest.mark.parametrize(
    ("text", "why"),
    [("[" * 10_000 + "]" * 10_000, "nested 10000 levels deep, more than 500"),
     ('{"a": [1e400]}', "the number 1e400 is beyond a float"),
     ("[NaN]", "the number NaN is beyond a float"),
     ("-Infinity", "the number -Infinity is beyond a float")],
)  # fmt: skip
def test_stored_json_python_cannot_read_or_send_back_is_unreadable(text, why):
    from django_cluster_jobs.stored import Unreadable, loads

    value = loads(text)
    assert isinstance(value, Unreadable) and why in value.reason
    assert loads('{"a": [1.5, 2, "x", null]}') == {"a": [1.5, 2, "x", None]}
    # Brackets within strings are no nesting; many siblings are no depth.
    assert loads('["' + "[" * 600 + '"]') == ["[" * 600]
    assert len(loads("[" + ",".join(["[]"] * 600) + "]")) == 600

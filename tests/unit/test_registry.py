"""The @job decorator, the Job it returns and the registry it fills."""

# String annotations on purpose: the context detection must see through them.
from __future__ import annotations

import dataclasses
import logging
import math
import threading
from datetime import UTC, datetime, timedelta

import django.apps
import pytest

import django_cluster_jobs
from django_cluster_jobs import (
    DuplicateJob,
    ImproperlyDeclared,
    InvalidPayload,
    Job,
    RegistryNotReady,
    RunContext,
    UnknownJob,
    job,
    registry,
)
from django_cluster_jobs.registry import with_options
from django_cluster_jobs.schedules import Cron, Delay, Every, OnDemand, Startup

MODULE = __name__


@pytest.fixture(autouse=True)
def clean_registry():
    """Keep the global registry as it was: unregister every job a test declared."""
    before = set(registry.names())
    yield
    for name in set(registry.names()) - before:
        registry.unregister(name)


def make_context(name: str = "unit.job", **changes) -> RunContext:
    fields = {
        "run_id": 7,
        "job": name,
        "key": "2026-05-28T09:00:00Z",
        "scheduled_at": datetime(2026, 5, 28, 9, 0, tzinfo=UTC),
        "attempt": 1,
        "fence": 3,
        "node_id": "node-a:1",
        "payload": {},
        "logger": logging.LoggerAdapter(logging.getLogger("tests.unit"), {}),
        "cancel_event": threading.Event(),
    }
    return RunContext(**{**fields, **changes})


# -- the decorator --------------------------------------------------------------------------------


def bare(x: int = 1) -> int:
    return x * 10


def test_bare_decorator_declares_an_on_demand_job_named_after_the_function():
    # What ``@job`` above a module-level ``def bare`` does (a function inside a test would be
    # named with ``<locals>``, which needs name=).
    declared = job(bare)

    name = f"{MODULE}.bare"
    assert isinstance(declared, Job)
    assert declared.name == name == declared.origin
    assert declared.schedule == OnDemand()
    assert declared() == 10
    assert declared(4) == 40
    assert declared(x=5) == 50
    assert registry.get(name) is declared
    assert name in registry


def test_job_is_a_frozen_dataclass_with_the_documented_defaults():
    @job(name="unit.registry.defaults")
    def handler() -> None:
        pass

    assert dataclasses.is_dataclass(handler)
    with pytest.raises(dataclasses.FrozenInstanceError):
        handler.name = "other"  # type: ignore[misc]
    assert (handler.placement, handler.delivery, handler.overlap, handler.misfire) == (
        "cluster",
        "at_least_once",
        "skip",
        "fire_once",
    )
    assert (handler.max_attempts, handler.priority, handler.queue, handler.enabled) == (
        1,
        0,
        "default",
        True,
    )
    assert (handler.payload, handler.backoff, handler.requires) == ({}, {}, frozenset())
    assert (handler.timeout, handler.catch_up_window, handler.max_concurrency) == (None, None, None)


def test_decorator_with_arguments_records_every_option():
    payload = {"report": "daily", "limit": 10}

    @job(
        name="unit.registry.options",
        cron="0 9 * * mon-fri",
        tz="Europe/Paris",
        placement="every_node",
        delivery="at_most_once",
        overlap="allow",
        misfire="skip",
        catch_up_window=timedelta(hours=1),
        max_attempts=3,
        backoff={"base": 2},
        timeout=timedelta(minutes=5),
        priority=9,
        queue="reports",
        max_concurrency=2,
        requires={"gpu"},
        payload=payload,
        enabled=False,
    )
    def send(report: str, limit: int) -> str:
        return f"{report}:{limit}"

    payload["limit"] = 99  # the declaration keeps its own copy
    assert send.name == "unit.registry.options"
    assert send.origin == f"{MODULE}.{send.func.__qualname__}"
    assert send.schedule == Cron("0 9 * * mon-fri", "Europe/Paris")
    assert (send.placement, send.delivery, send.overlap, send.misfire) == (
        "every_node",
        "at_most_once",
        "allow",
        "skip",
    )
    assert send.catch_up_window == timedelta(hours=1)
    assert (send.max_attempts, send.backoff, send.timeout) == (3, {"base": 2}, timedelta(minutes=5))
    assert (send.priority, send.queue, send.max_concurrency) == (9, "reports", 2)
    assert send.requires == frozenset({"gpu"})
    assert send.payload == {"report": "daily", "limit": 10}
    assert send.enabled is False
    assert send("weekly", limit=1) == "weekly:1"
    assert registry.get("unit.registry.options") is send


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"cron": "*/10 * * * * *"}, Cron("*/10 * * * * *")),
        ({"cron": "0 9 * * *", "tz": "America/New_York"}, Cron("0 9 * * *", "America/New_York")),
        ({"every": timedelta(seconds=30)}, Every(timedelta(seconds=30))),
        ({"delay": timedelta(minutes=2)}, Delay(timedelta(minutes=2))),
        ({"startup": True}, Startup()),
        ({}, OnDemand()),
        ({"schedule": Every(timedelta(seconds=5))}, Every(timedelta(seconds=5))),
        ({"cron": None, "every": None, "startup": False}, OnDemand()),
    ],
)
def test_each_schedule_option(options, expected):
    @job(name="unit.registry.schedule", **options)
    def handler() -> None:
        pass

    assert handler.schedule == expected


def test_definition_fields_describe_the_declaration():
    @job(name="unit.registry.fields", every=timedelta(seconds=30), requires={"b", "a"})
    def handler() -> None:
        pass

    fields = handler.definition_fields()
    assert fields["callable_name"] == "unit.registry.fields"
    assert fields["source"] == "code"
    assert (fields["schedule_kind"], fields["interval"]) == ("every", timedelta(seconds=30))
    assert fields["requires"] == ["a", "b"]


def test_with_options_copies_a_declaration():
    @job(name="unit.registry.copy")
    def handler() -> None:
        pass

    copy = with_options(handler, enabled=False, priority=5)
    assert (copy.enabled, copy.priority, copy.func) == (False, 5, handler.func)
    assert (handler.enabled, handler.priority) == (True, 0)


# -- duplicates -----------------------------------------------------------------------------------


def test_duplicate_name_from_another_function_is_refused_and_the_first_kept():
    @job(name="unit.registry.twice", every=timedelta(seconds=5))
    def first() -> str:
        return "first"

    with pytest.raises(DuplicateJob) as caught:

        @job(name="unit.registry.twice", cron="* * * * *")
        def second() -> str:  # pragma: no cover - never registered
            return "second"

    error = caught.value
    here = f"{MODULE}.test_duplicate_name_from_another_function_is_refused_and_the_first_kept"
    first_origin, second_origin = f"{here}.<locals>.first", f"{here}.<locals>.second"
    assert (error.name, error.first, error.second) == (
        "unit.registry.twice",
        first_origin,
        second_origin,
    )
    assert first.origin == first_origin
    assert first_origin in str(error)
    assert second_origin in str(error)
    assert "@job(name=...)" in str(error)
    kept = registry.get("unit.registry.twice")
    assert kept is first
    assert kept() == "first"
    assert kept.schedule == Every(timedelta(seconds=5))


def test_registering_the_same_function_again_is_allowed():
    def handler() -> str:
        return "same"

    declared = job(name="unit.registry.again")(handler)
    again = job(name="unit.registry.again", every=timedelta(seconds=1))(handler)
    assert registry.get("unit.registry.again") is again
    assert again.origin == declared.origin
    assert registry.register(declared) is declared
    assert registry.get("unit.registry.again") is declared


# -- invalid declarations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "hint"),
    [
        ("placement", "everywhere", "choose one of cluster, every_node"),
        ("delivery", "exactly_twice", "choose one of at_least_once, at_most_once, exactly_once"),
        ("overlap", "queue", "choose one of skip, allow, buffer_one, cancel_other"),
        ("misfire", "catch_up", "choose one of fire_once, skip, run_all"),
        ("max_attempts", 0, "1 or more"),
        ("max_attempts", -2, "1 or more"),
        ("max_attempts", "3", "1 or more"),
        ("max_attempts", 2.5, "1 or more"),
    ],
)
def test_invalid_policy_is_refused_with_job_name_and_field(option, value, hint):
    with pytest.raises(ImproperlyDeclared) as caught:

        @job(name="unit.registry.bad", **{option: value})
        def handler() -> None:  # pragma: no cover - never declared
            pass

    error = caught.value
    assert (error.job, error.field, error.value) == ("unit.registry.bad", option, value)
    assert hint in error.hint
    assert str(error) == f"Job 'unit.registry.bad': invalid {option} {value!r}: {error.hint}"
    assert "unit.registry.bad" not in registry


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        ({"when": datetime(2026, 5, 28, tzinfo=UTC)}, "not JSON serializable"),
        ({"ratio": math.nan}, "Out of range float values"),
        ({"items": {1, 2}}, "not JSON serializable"),
        ({1: "one"}, "keys must be str"),
        ([("a", 1)], "must be a dict"),
        ("a=1", "must be a dict"),
    ],
)
def test_payload_that_is_not_json_is_refused(payload, detail):
    with pytest.raises(InvalidPayload) as caught:

        @job(name="unit.registry.payload", payload=payload)
        def handler(**kwargs) -> None:  # pragma: no cover - never declared
            pass

    assert caught.value.job == "unit.registry.payload"
    assert str(caught.value).startswith("Job 'unit.registry.payload': the payload is not JSON")
    assert detail in str(caught.value)
    assert "unit.registry.payload" not in registry


@pytest.mark.parametrize(
    "options",
    [
        {"cron": "* * * * *", "every": timedelta(seconds=5)},
        {"every": timedelta(seconds=5), "delay": timedelta(seconds=5)},
        {"delay": timedelta(seconds=5), "startup": True},
        {"schedule": OnDemand(), "cron": "* * * * *"},
    ],
)
def test_two_schedules_at_once_are_refused(options):
    with pytest.raises(ImproperlyDeclared) as caught:

        @job(name="unit.registry.both", **options)
        def handler() -> None:  # pragma: no cover - never declared
            pass

    error = caught.value
    assert (error.job, error.field, error.value) == (
        "unit.registry.both",
        "schedule",
        sorted(options),
    )
    assert "give at most one of cron=, every=, delay=, startup=, schedule=" in str(error)


def test_schedule_must_be_a_schedule_object():
    with pytest.raises(ImproperlyDeclared) as caught:

        @job(name="unit.registry.object", schedule="* * * * *")
        def handler() -> None:  # pragma: no cover - never declared
            pass

    assert (caught.value.job, caught.value.field) == ("unit.registry.object", "schedule")
    assert "pass a Schedule object" in str(caught.value)


def test_unknown_option_is_a_type_error_listing_the_valid_ones():
    with pytest.raises(TypeError) as caught:
        job(name="unit.registry.typo", crom="* * * * *", retries=3)
    message = str(caught.value)
    assert message.startswith("job() got unknown option(s) crom, retries; valid: name, cron, tz,")
    for option in ("every", "delay", "startup", "placement", "max_attempts", "payload", "enabled"):
        assert option in message
    assert "unit.registry.typo" not in registry


# -- the run context ------------------------------------------------------------------------------


def takes_ctx(ctx, value=0):
    return ("ctx", ctx.run_id, value)


def takes_context(context):
    return ("context", context.run_id)


def takes_annotated(run: RunContext, value=0):
    return ("annotated", run.run_id, value)


def takes_dotted(run: django_cluster_jobs.RunContext):
    return ("dotted", run.run_id)


def takes_quoted(run: RunContext):
    return ("quoted", run.run_id)


def takes_nothing():
    return "nothing"


def takes_payload_only(value=0, label=""):
    return ("payload", value, label)


def takes_keyword_ctx(*, ctx=None):
    return ("keyword", ctx)


def takes_unresolvable(run: NotDefinedAnywhere):  # noqa: F821
    return ("unresolvable", run)


def takes_args(*args):
    return ("args", args)


@pytest.mark.parametrize(
    ("func", "wants"),
    [
        (takes_ctx, True),
        (takes_context, True),
        (takes_annotated, True),
        (takes_dotted, True),
        (takes_quoted, True),
        (lambda ctx: ctx, True),
        (takes_nothing, False),
        (takes_payload_only, False),
        (takes_keyword_ctx, False),
        (takes_unresolvable, False),
        (takes_args, False),
    ],
)
def test_wants_context(func, wants):
    declared = job(name="unit.registry.context")(func)
    assert declared.wants_context is wants


def test_invoke_passes_the_context_and_the_payload_as_keyword_arguments():
    context = make_context(run_id=42)
    assert job(name="unit.registry.ctx")(takes_ctx).invoke(context, {"value": 3}) == ("ctx", 42, 3)
    assert job(name="unit.registry.ann")(takes_annotated).invoke(context, {}) == (
        "annotated",
        42,
        0,
    )
    assert job(name="unit.registry.dotted")(takes_dotted).invoke(context, {}) == ("dotted", 42)


def test_invoke_without_context_passes_only_the_payload():
    declared = job(name="unit.registry.plain")(takes_payload_only)
    assert declared.invoke(make_context(), {"value": 2, "label": "x"}) == ("payload", 2, "x")
    assert job(name="unit.registry.nothing")(takes_nothing).invoke(make_context(), {}) == "nothing"


# -- lookups --------------------------------------------------------------------------------------


def test_get_unknown_name_lists_the_known_jobs():
    job(name="unit.registry.alpha")(takes_nothing)
    job(name="unit.registry.beta")(takes_ctx)
    with pytest.raises(UnknownJob) as caught:
        registry.get("unit.registry.gamma")
    message = str(caught.value)
    assert caught.value.name == "unit.registry.gamma"
    assert message.startswith("No job named 'unit.registry.gamma' is registered (registered jobs: ")
    assert "unit.registry.alpha, unit.registry.beta" in message
    assert ", ".join(registry.names()) in message
    assert "Declare it with @job" in message


def test_names_contains_iterate_and_unregister():
    declared = job(name="unit.registry.listed")(takes_nothing)
    assert "unit.registry.listed" in registry.names()
    assert registry.names() == sorted(registry.names())
    assert declared in list(registry)
    registry.unregister("unit.registry.listed")
    assert "unit.registry.listed" not in registry
    registry.unregister("unit.registry.listed")  # unregistering twice is harmless


def test_get_before_the_app_registry_is_ready(monkeypatch):
    job(name="unit.registry.early")(takes_nothing)
    monkeypatch.setattr(django.apps.apps, "ready", False)
    with pytest.raises(RegistryNotReady) as caught:
        registry.get("unit.registry.early")
    assert "Call django.setup() first" in str(caught.value)
    monkeypatch.undo()
    assert registry.get("unit.registry.early").name == "unit.registry.early"


def test_a_per_job_fixed_rate_anchor_is_refused():
    """Anchors are not stored: every grid must come from EPOCH, or nodes would disagree."""
    from datetime import UTC, datetime, timedelta

    from django_cluster_jobs import Every, ImproperlyDeclared, job

    anchored = Every(timedelta(minutes=1), anchor=datetime(2026, 1, 1, tzinfo=UTC))
    with pytest.raises(ImproperlyDeclared, match="anchored on CLUSTER_JOBS\\['EPOCH'\\]"):
        job(name="tests.anchored", schedule=anchored)(lambda: None)

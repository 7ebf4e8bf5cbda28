"""What ``@job`` refuses at declaration: every refusal names the job, the field, the value, the fix.

Each of these declarations used to pass (and crash a node later, or behave otherwise than it
reads) or to fail with an error that did not say what to change.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from django_cluster_jobs import ImproperlyDeclared, InvalidPayload, Job, RunContext, job, registry

pytestmark = pytest.mark.usefixtures("registry_restored")

NAME = "unit.declarations.job"
#: Django Tasks' priority range (validation.PRIORITY_MIN and PRIORITY_MAX).
PRIORITY_MIN, PRIORITY_MAX = -100, 100
LOG = logging.LoggerAdapter(logging.getLogger("tests.unit"), {})


def handler() -> None:
    """A module-level handler: its default name is routable."""


def handler_taking(value: int = 0) -> int:
    return value


def handler_needing(value: int) -> int:
    return value


def refused(**options) -> ImproperlyDeclared:
    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=NAME, **options)(handler_taking)
    assert NAME not in registry
    return caught.value


def says(error: ImproperlyDeclared, field: str, *words: str) -> None:
    """The error names the job and the field, and its fix mentions every word."""
    assert (error.job, error.field) == (NAME, field)
    text = str(error)
    assert text.startswith(f"Job {NAME!r}: invalid {field} ")
    for word in words:
        assert word in text


# -- item 7: declarations that pass on SQLite and crash start-up on PostgreSQL -------------------


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"name": "n" * 201}, "name", ("at most 200 characters",)),
        ({"name": "nul\x00name"}, "name", ("NUL",)),
        ({"queue": "q" * 101}, "queue", ("at most 100 characters",)),
        ({"queue": "nul\x00queue"}, "queue", ("NUL",)),
        ({"priority": 2**31}, "priority", (f"from {PRIORITY_MIN} to {PRIORITY_MAX}",)),
        ({"priority": PRIORITY_MAX + 1}, "priority", ("larger runs sooner",)),
        ({"priority": PRIORITY_MIN - 1}, "priority", ("whole number",)),
        ({"priority": "high"}, "priority", ("whole number",)),
        ({"priority": True}, "priority", ("whole number",)),
        ({"queue": None}, "queue", ("str",)),
        ({"enabled": "no"}, "enabled", ("True or False",)),
        ({"enabled": 0}, "enabled", ("True or False",)),
    ],
)
def test_a_value_no_database_column_can_hold_is_refused(options, field, words):
    if "name" in options:
        with pytest.raises(ImproperlyDeclared) as caught:
            job(**options)(handler)
        error = caught.value
        assert error.field == "name" and all(word in str(error) for word in words)
        return
    says(refused(**options), field, *words)


def test_the_priority_bounds_are_accepted():
    assert job(name=NAME, priority=PRIORITY_MAX)(handler).priority == PRIORITY_MAX
    registry.unregister(NAME)
    assert job(name=NAME, priority=PRIORITY_MIN)(handler).priority == PRIORITY_MIN


# -- item 8: async and generator handlers ---------------------------------------------------------


def test_a_generator_function_is_refused_at_declaration():
    def produce():
        yield 1

    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=NAME)(produce)
    says(caught.value, "callable", "generator", "return")


def test_an_async_generator_function_is_refused_at_declaration():
    async def produce():
        yield 1

    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=NAME)(produce)
    says(caught.value, "callable", "generator")


def test_a_plain_async_handler_is_accepted():
    async def handle(value: int = 0) -> int:
        return value

    declared = job(name=NAME, payload={"value": 2})(handle)
    assert isinstance(declared, Job) and registry.get(NAME) is declared


# -- item 10: silent misconfiguration --------------------------------------------------------------


def test_requires_a_str_alone_is_refused_not_split_into_letters():
    says(refused(requires="gpu"), "requires", "iterable of str", "{'gpu'}")


@pytest.mark.parametrize("requires", [["gpu", 1], [""], ["nul\x00"], {"gpu": True}, 5])
def test_requires_must_be_an_iterable_of_tags(requires):
    says(refused(requires=requires), "requires", "str")


def test_requires_as_a_list_tuple_or_set_is_accepted():
    for requires in (["gpu"], ("gpu", "eu"), {"gpu"}, frozenset({"eu"})):
        declared = job(name=NAME, requires=requires)(handler)
        assert declared.requires == frozenset(requires)
        registry.unregister(NAME)


@pytest.mark.parametrize("name", [5, b"bytes", ["a"]])
def test_a_name_that_is_not_a_str_is_refused(name):
    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=name)(handler)
    error = caught.value
    assert error.field == "name" and error.value == name
    assert error.job == f"{__name__}.handler"  # the job it would have been
    assert "str" in error.hint


@pytest.mark.parametrize("target", [5, None, "text", object()])
def test_decorating_what_is_not_callable_is_refused(target):
    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=NAME)(target)
    says(caught.value, "callable", "function")


def test_a_cron_string_as_the_first_argument_says_to_use_cron():
    with pytest.raises(ImproperlyDeclared) as caught:

        @job("0 9 * * *")
        def nightly() -> None:  # pragma: no cover - never declared
            pass

    error = caught.value
    assert (error.field, error.value) == ("cron", "0 9 * * *")
    assert "@job(cron='0 9 * * *')" in error.hint
    assert error.job.endswith(".nightly")


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
    ],
)
def test_a_cron_macro_is_refused_with_its_five_field_equivalent(macro, equivalent):
    says(refused(cron=macro), "cron", f"cron={equivalent!r}")


def test_reboot_says_to_use_startup():
    says(refused(cron="@reboot"), "cron", "startup=True")


@pytest.mark.parametrize("expr", ["R * * * *", "0 R(0-5) * * *", "h * * * *"])
def test_a_random_or_hashed_cron_field_is_refused(expr):
    """croniter picks R at random per process: nodes would disagree on the occurrences."""
    says(refused(cron=expr), "cron", "every node")


def test_a_payload_the_handler_cannot_take_is_refused_at_declaration():
    with pytest.raises(InvalidPayload) as caught:
        job(name=NAME, payload={"valeu": 3})(handler_taking)
    error = caught.value
    assert (error.job, error.field) == (NAME, "payload")
    assert "unexpected keyword argument 'valeu'" in str(error)


def test_a_scheduled_job_must_get_every_argument_its_handler_needs():
    with pytest.raises(InvalidPayload, match="missing a required argument: 'value'"):
        job(name=NAME, cron="0 9 * * *")(handler_needing)
    declared = job(name=NAME, cron="0 9 * * *", payload={"value": 1})(handler_needing)
    assert declared.payload == {"value": 1}


def test_an_on_demand_job_may_leave_arguments_to_each_enqueue():
    assert job(name=NAME)(handler_needing).payload == {}


def test_tz_without_cron_is_refused():
    for options in ({"tz": "Europe/Paris"}, {"tz": "UTC", "every": timedelta(seconds=5)}):
        says(refused(**options), "tz", "cron=")
        assert NAME not in registry


def test_a_name_from_locals_says_to_pass_name():
    def local() -> None:  # pragma: no cover - never declared
        pass

    with pytest.raises(ImproperlyDeclared) as caught:
        job(local)
    error = caught.value
    assert error.field == "name" and "<locals>" in error.value
    assert "name=" in error.hint


def test_a_lambda_needs_a_name():
    with pytest.raises(ImproperlyDeclared, match="name="):
        job(lambda: None)


def test_the_default_name_of_a_module_level_function_is_accepted():
    declared = job(handler)
    assert declared.name == f"{__name__}.handler"


@pytest.mark.parametrize("name", ["a/b", "a b", "..", ".hidden", "a?b", "tab\tname", "é/x", ""])
def test_a_name_the_api_cannot_route_is_refused(name):
    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=name)(handler)
    assert caught.value.field == "name"
    assert "letters, digits" in caught.value.hint or "non-empty" in caught.value.hint


# -- items 3 and 9 at declaration: bounds that keep the engine's date arithmetic safe -------------


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"every": timedelta(days=500000)}, "every", ("at most",)),
        ({"delay": timedelta(days=500000)}, "delay", ("at most",)),
        ({"catch_up_window": timedelta(days=999999)}, "catch_up_window", ("at most",)),
        ({"breaker_threshold": 3, "breaker_cooldown": timedelta(days=10**6)}, "breaker_cooldown",
         ("at most",)),
        ({"timeout": timedelta(days=365)}, "timeout", ("at most",)),
        ({"timeout": timedelta(0)}, "timeout", ("positive",)),
        ({"timeout": timedelta(seconds=-1)}, "timeout", ("positive",)),
        ({"timeout": 30}, "timeout", ("timedelta",)),
        ({"catch_up_limit": 0}, "catch_up_limit", ("1 or more",)),
        ({"catch_up_limit": 10**9}, "catch_up_limit", ("at most",)),
        ({"max_attempts": 10**6}, "max_attempts", ("at most",)),
        ({"max_concurrency": 0}, "max_concurrency", ("1 or more",)),
        ({"breaker_threshold": 0}, "breaker_threshold", ("1 or more",)),
        ({"breaker_threshold": 2**40}, "breaker_threshold", ("at most",)),
        ({"executor": "celery"}, "executor", ("thread, process",)),
        ({"backoff": {"kind": "linear"}}, "backoff", ("fixed",)),
        ({"backoff": {"base": "1"}}, "backoff", ("number",)),
        ({"backoff": {"base": -1}}, "backoff", ("number",)),
        ({"backoff": {"factor": 10**6}}, "backoff", ("at most",)),
        ({"backoff": {"cap": float("inf")}}, "backoff", ("number",)),
        ({"backoff": {"cap": float("nan")}}, "backoff", ("number",)),
        ({"backoff": {"retries": 3}}, "backoff", ("kind, base, factor, cap",)),
        ({"backoff": [("base", 1)]}, "backoff", ("dict",)),
        ({"backoff": "exponential"}, "backoff", ("dict",)),
        ({"backoff": {"kind": ["fixed"]}}, "backoff", ("fixed",)),
    ],
)  # fmt: skip
def test_a_policy_the_engine_cannot_use_is_refused(options, field, words):
    says(refused(**options), field, *words)


def test_a_breaker_without_a_cooldown_gets_the_default_one():
    declared = job(name=NAME, breaker_threshold=3)(handler)
    assert declared.breaker_cooldown == timedelta(minutes=5)


def test_a_huge_payload_is_refused_with_its_size_not_its_text():
    with pytest.raises(InvalidPayload) as caught:
        job(name=NAME, payload={"value": "x" * 2_000_000})(handler_taking)
    text = str(caught.value)
    assert "MAX_PAYLOAD_BYTES" in text and len(text) < 600


def nest(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "payload", [{"value": "a\x00b"}, {"value": {"k\x00": 1}}, {"\x00": 1}, {"value": nest(100)}]
)
def test_a_payload_postgresql_cannot_store_is_refused(payload):
    with pytest.raises(InvalidPayload) as caught:
        job(name=NAME, payload=payload)(handler_taking)
    assert caught.value.job == NAME


def test_the_first_of_several_problems_is_raised_in_column_order():
    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=NAME, priority=500, queue="")(handler)
    assert caught.value.field == "priority"


# -- takes_context: said, not guessed ------------------------------------------------------------


def keyword_only(*, value: int = 0) -> int:
    return value


def no_parameters() -> str:
    return "none"


def first_is_run(run, value: int = 0):
    return (run, value)


def first_is_ctx(ctx=None, value: int = 0):
    return (ctx, value)


def takes_all(*args):
    return args


@pytest.mark.parametrize("handler_", [keyword_only, no_parameters])
def test_takes_context_true_needs_a_positional_parameter(handler_):
    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=NAME, takes_context=True)(handler_)
    assert NAME not in registry
    says(caught.value, "takes_context", "True", handler_.__qualname__, "positional parameter")
    assert "takes_context=True" in str(caught.value)


@pytest.mark.parametrize("value", ["yes", 1, 0])
def test_takes_context_must_be_a_bool_or_none(value):
    with pytest.raises(ImproperlyDeclared) as caught:
        job(name=NAME, takes_context=value)(first_is_run)
    says(caught.value, "takes_context", "True", "False", "None")


def test_takes_context_true_passes_the_context_whatever_the_parameter_is_called():
    declared = job(name=NAME, takes_context=True)(first_is_run)
    context = RunContext(1, NAME, "k", datetime(2026, 1, 1, tzinfo=UTC), 1, 1, "n", {}, LOG)
    assert declared.wants_context is True
    assert declared.invoke(context, {"value": 2}) == (context, 2)


def test_takes_context_true_accepts_star_args():
    declared = job(name=NAME, takes_context=True)(takes_all)
    context = RunContext(1, NAME, "k", datetime(2026, 1, 1, tzinfo=UTC), 1, 1, "n", {}, LOG)
    assert declared.invoke(context, {}) == (context,)


def test_takes_context_false_never_passes_it_even_to_a_parameter_named_ctx():
    declared = job(name=NAME, takes_context=False)(first_is_ctx)
    context = RunContext(1, NAME, "k", datetime(2026, 1, 1, tzinfo=UTC), 1, 1, "n", {}, LOG)
    assert declared.wants_context is False
    assert declared.invoke(context, {"value": 3}) == (None, 3)


def test_the_payload_is_bound_after_the_context_the_declaration_says():
    # The context fills the first parameter, so a scheduled job needs no payload for it ...
    assert job(name=NAME, every=timedelta(minutes=1), takes_context=True)(first_is_run)
    registry.unregister(NAME)
    # ... and without the context, ``run`` is a required argument the payload must give.
    with pytest.raises(InvalidPayload):
        job(name=NAME, every=timedelta(minutes=1), takes_context=False)(first_is_run)


def test_takes_context_none_keeps_the_inference():
    assert job(name=NAME)(first_is_ctx).wants_context is True
    registry.unregister(NAME)
    assert job(name=NAME, takes_context=None)(first_is_run).wants_context is False

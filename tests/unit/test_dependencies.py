"""Declaring dependencies: after= by job object or name, and the checks of the graph."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import checks

from django_cluster_jobs import job
from django_cluster_jobs.checks import check_code_dependencies, check_stored_dependencies
from django_cluster_jobs.exceptions import ImproperlyDeclared
from django_cluster_jobs.validation import definition_errors, graph_errors

pytestmark = pytest.mark.usefixtures("registry_restored")


def test_after_takes_job_objects_and_names_and_stores_names():
    @job(name="unit.extract", cron="0 1 * * *")
    def extract() -> None: ...

    @job(name="unit.load", after=[extract, "unit.other"])
    def load() -> None: ...

    assert load.after == ("unit.extract", "unit.other")
    assert load.definition_fields()["after"] == ["unit.extract", "unit.other"]
    assert extract.after == () and extract.definition_fields()["after"] == []


@pytest.mark.parametrize(
    ("options", "value", "hint"),
    [
        ({"after": "unit.extract"}, "unit.extract", "list the names of the jobs"),
        ({"after": [1]}, (1,), "the name 1"),
        ({"after": ["a.b", "a.b"]}, ("a.b", "a.b"), "name each predecessor once"),
        ({"after": ["unit.self"]}, ("unit.self",), "cycle unit.self -> unit.self"),
        ({"after": ["a.b"], "cron": "0 1 * * *"}, ("a.b",), "has no schedule of its own"),
        ({"after": ["a.b"], "every": timedelta(seconds=5)}, ("a.b",), "(this one is every)"),
    ],
)
def test_a_bad_after_names_the_job_the_field_the_value_and_the_fix(options, value, hint):
    with pytest.raises(ImproperlyDeclared) as caught:

        @job(name="unit.self", **options)
        def handler() -> None: ...

    assert (caught.value.job, caught.value.field, caught.value.value) == ("unit.self", "after",
                                                                          value)  # fmt: skip
    assert hint in caught.value.hint


def test_the_same_validator_refuses_a_stored_dependent_with_a_schedule():
    values = {"schedule_kind": "cron", "cron": "0 1 * * *", "after": ["a.b"]}
    [problem] = definition_errors(values, job="db.job")
    assert (problem.job, problem.field) == ("db.job", "after")


def test_graph_errors_name_an_unknown_predecessor():
    [problem] = graph_errors({"b": ["a", "missing"]}, known={"a", "b"})
    assert (problem.job, problem.field, problem.value) == ("b", "after", ["a", "missing"])
    assert "no job named 'missing' is declared or stored" in problem.hint


def test_graph_errors_name_each_cycle_with_its_path():
    graph = {"a": ["c"], "b": ["a"], "c": ["b"], "d": ["a"], "x": ["y"], "y": ["x"]}
    problems = graph_errors(graph, known=set(graph))
    paths = sorted(p.hint for p in problems)
    assert len(problems) == 2, paths
    assert any("a -> b -> c -> a" in hint or "b -> c -> a -> b" in hint
               or "c -> a -> b -> c" in hint for hint in paths)  # fmt: skip
    assert any("x -> y -> x" in hint or "y -> x -> y" in hint for hint in paths)
    assert all(p.field == "after" and p.hint.endswith("remove one of these dependencies")
               for p in problems)  # fmt: skip


def test_graph_errors_accept_a_diamond():
    graph = {"b": ["a"], "c": ["a"], "d": ["b", "c"]}
    assert graph_errors(graph, known={"a", "b", "c", "d"}) == []


def test_check_reports_a_code_cycle_and_an_unknown_predecessor():
    @job(name="unit.one", after=["unit.two"])
    def one() -> None: ...

    @job(name="unit.two", after=["unit.one"])
    def two() -> None: ...

    @job(name="unit.three", after=["unit.nowhere"])
    def three() -> None: ...

    messages = check_code_dependencies()
    assert {m.id for m in messages} == {"cluster_jobs.E006"}
    text = "\n".join(m.msg for m in messages)
    assert "'unit.nowhere'" in text and "it makes a cycle, unit." in text
    assert len(messages) == 2


@pytest.mark.django_db
def test_check_reports_what_database_jobs_add_to_the_graph():
    from tests.factories import JobDefinitionFactory

    JobDefinitionFactory(name="db.report", schedule_kind="on_demand", cron="",
                         after=["tests.flow_d", "db.nowhere"])  # fmt: skip
    JobDefinitionFactory(name="db.loop_a", schedule_kind="on_demand", cron="", after=["db.loop_b"])
    JobDefinitionFactory(name="db.loop_b", schedule_kind="on_demand", cron="", after=["db.loop_a"])
    messages = check_stored_dependencies()
    # Warnings: what is stored never makes migrate, check or runscheduler exit.
    assert {m.id for m in messages} == {"cluster_jobs.W007"}
    assert all(isinstance(m, checks.Warning) and not m.is_serious() for m in messages)
    text = "\n".join(m.msg for m in messages)
    assert "Job 'db.report'" in text and "'db.nowhere'" in text
    loop = ("db.loop_a -> db.loop_b -> db.loop_a", "db.loop_b -> db.loop_a -> db.loop_b")
    assert any(path in text for path in loop)
    assert len(messages) == 2
    assert check_code_dependencies() == []  # the test project's own workflow is sound

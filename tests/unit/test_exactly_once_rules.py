"""delivery="exactly_once": where it is refused (the one validator, the checks), the handler's
idempotency key, and a model of attempts, takeovers and commits (hypothesis)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from django_cluster_jobs import checks as cluster_checks
from django_cluster_jobs import job
from django_cluster_jobs.context import RunContext
from django_cluster_jobs.exceptions import ImproperlyDeclared
from django_cluster_jobs.validation import definition_errors

pytestmark = pytest.mark.usefixtures("registry_restored")


def test_a_process_executor_is_refused_with_the_fix():
    [problem] = definition_errors({"delivery": "exactly_once", "executor": "process"}, job="x")
    assert problem.field == "executor"
    assert "use executor='thread'" in str(problem)


def test_an_async_handler_is_refused_at_the_decorator():
    with pytest.raises(ImproperlyDeclared) as raised:

        @job(name="tests.async_once", delivery="exactly_once", timeout=timedelta(seconds=1))
        async def async_once() -> None: ...

    assert raised.value.field == "delivery"
    assert "is async" in str(raised.value) and "make it a plain def" in str(raised.value)


def _declare(**options) -> None:
    @job(name="tests.declared_once", delivery="exactly_once", **options)
    def declared_once() -> None: ...


def declared_once_messages() -> list:
    return [m for m in cluster_checks.check_exactly_once() if "declared_once" in m.msg]


def test_the_checks_warn_of_a_job_without_a_timeout():
    _declare()
    assert [m.id for m in declared_once_messages()] == ["cluster_jobs.W040"]


def test_the_checks_refuse_a_ledger_apart_from_the_default_database(monkeypatch):
    _declare(timeout=timedelta(seconds=1))
    monkeypatch.setattr(cluster_checks, "DEFAULT_DB_ALIAS", "elsewhere")
    messages = declared_once_messages()
    assert [m.id for m in messages] == ["cluster_jobs.E040"]
    assert "ledger is on the database 'default'" in messages[0].msg


def test_the_checks_warn_of_a_long_job_on_sqlite(monkeypatch):
    _declare(timeout=timedelta(seconds=60))
    monkeypatch.setattr(cluster_checks, "vendor_of", lambda alias: "sqlite")
    with override_settings(CLUSTER_JOBS={"EXACTLY_ONCE_SQLITE_SECONDS": 30}):
        messages = declared_once_messages()
    assert [m.id for m in messages] == ["cluster_jobs.W041"]
    assert "EXACTLY_ONCE_SQLITE_SECONDS" in messages[0].hint and "30s" in messages[0].hint


def test_the_idempotency_key_names_the_occurrence_not_the_attempt():
    def context(attempt: int) -> RunContext:
        return RunContext(run_id=7, job="billing.invoices", key="2026-12-05T09:00:00Z",
                          scheduled_at=datetime(2026, 12, 5, 9, tzinfo=UTC), attempt=attempt,
                          fence=attempt, node_id="n", payload={},
                          logger=logging.LoggerAdapter(logging.getLogger("x")),
                          cancel_event=threading.Event())  # fmt: skip

    assert {context(1).idempotency_key, context(3).idempotency_key} == {
        "billing.invoices@2026-12-05T09:00:00Z"
    }


# -- a model: attempts, takeovers and commits --------------------------------------------------


@dataclass
class Attempt:
    """An attempt's open transaction: the fence it was given, and whether it wrote."""

    fence: int
    wrote: bool = False


@dataclass
class Run:
    """The run's row as committed, and the effects committed with an end."""

    fence: int = 1
    ended: bool = False
    effects: int = 0
    attempts: list[Attempt] = field(default_factory=lambda: [Attempt(1)])


class ExactlyOnce(RuleBasedStateMachine):
    """Attempts write, commit (their fenced end with their effects, or roll back), die, or are
    taken over (the fence moves, committed, and a new attempt starts). The product's rule: an
    attempt commits only when its fence is the row's and the run has not ended."""

    def __init__(self) -> None:
        super().__init__()
        self.run = Run()

    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        if self.run.attempts:
            data.draw(st.sampled_from(self.run.attempts)).wrote = True

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        if not self.run.attempts:
            return
        attempt = data.draw(st.sampled_from(self.run.attempts))
        self.run.attempts.remove(attempt)
        if attempt.fence == self.run.fence and not self.run.ended:  # the fenced end matches
            self.run.ended = True
            self.run.effects += 1 if attempt.wrote else 0
        # else: the end matches no row; the transaction, and its writes, roll back

    @rule(data=st.data())
    def die(self, data: st.DataObject) -> None:
        if self.run.attempts:  # the session ends: its transaction rolls back
            self.run.attempts.remove(data.draw(st.sampled_from(self.run.attempts)))

    @rule()
    def take_over(self) -> None:
        if not self.run.ended:  # a lease expired or a node was lost: the fence moves
            self.run.fence += 1
            self.run.attempts.append(Attempt(self.run.fence))

    @invariant()
    def effects_at_most_once(self) -> None:
        assert self.run.effects <= 1

    @invariant()
    def an_ended_run_has_its_effects_once(self) -> None:
        assert not self.run.ended or self.run.effects in (0, 1)


ExactlyOnce.TestCase.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
TestExactlyOnceModel = ExactlyOnce.TestCase

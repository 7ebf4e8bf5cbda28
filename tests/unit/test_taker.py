"""The taker's plan of its next look: no announcement lost, no poll where none is needed."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from django_cluster_jobs.conf import app_settings
from django_cluster_jobs.coordination.orm import ORMVendor
from django_cluster_jobs.engine import Node
from django_cluster_jobs.engine.taker import Taker
from django_cluster_jobs.models import JobDefinition

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Host(SimpleNamespace):
    """What the taker uses of a node: one job, no limits, a ledger that answers from a list."""

    def __init__(self, *, every: float | None, listening: bool = True) -> None:
        self.calls: list[str] = []
        super().__init__(
            clock=SimpleNamespace(now=lambda: NOW),
            wake=threading.Event(),
            stopping=False,
            node_id="n",
            listening=listening,
            log_extra={},
            ledger=SimpleNamespace(next_pending_due=self.next_due, vendor=SimpleNamespace(
                take_pending=self.take)),
            on_read=lambda: None,
        )  # fmt: skip
        self.every = every

    def look_every(self) -> float | None:
        return self.every

    def free_threads(self) -> int:
        return 2

    def next_due(self, job_ids):
        self.calls.append("read")
        self.on_read()
        return None

    def take(self, *args):
        self.calls.append("take")
        return []


PLANNED = {1: SimpleNamespace(definition=JobDefinition(pk=1, name="a"))}


def test_an_announcement_during_a_pass_is_not_lost_with_its_plan():
    """A run committed after the pass's last read is announced while the pass plans: the taker
    looks again at once instead of sleeping until an announcement that already came."""
    host = Host(every=None)
    taker = Taker(host)
    host.on_read = taker.wake  # the announcement lands right after the read
    taker.wake()
    taker.tick(PLANNED, NOW)
    assert taker.due is not None and taker.due <= NOW


def test_a_listening_node_without_safety_poll_sleeps_until_announced():
    host = Host(every=None)
    taker = Taker(host)
    taker.wake()
    taker.tick(PLANNED, NOW)
    assert host.calls == ["take", "read"] and taker.due is None


def test_a_safety_poll_reads_before_it_takes():
    """A look nothing announced (the wake file's safety poll) reads first: on SQLite it takes
    the writer lock only when a run is due."""
    host = Host(every=10.0)
    taker = Taker(host)
    taker.wake()
    taker.tick(PLANNED, NOW)
    assert taker.due == NOW + timedelta(seconds=10) and taker.polling
    host.calls.clear()
    taker.tick(PLANNED, taker.due)
    assert host.calls == ["read"]


def orm_node() -> SimpleNamespace:
    """What a node reads to choose how it hears of pending runs, on the portable ORM path
    (Node's own code, on a vendor that neither notifies nor has a wake file)."""
    node = SimpleNamespace(
        ledger=SimpleNamespace(alias="default", vendor=ORMVendor("default")), node_id="n"
    )
    node.listener = Node._make_listener(node)
    node.listening = Node.listening.fget(node)
    return node


def test_where_nothing_announces_a_run_a_look_that_finds_none_polls_one_interval_later():
    """On the ORM path no notification comes: an idle node finds an enqueued run by its poll,
    which is due exactly POLL_INTERVAL after a look that found nothing, and not before."""
    orm = orm_node()
    assert orm.listener is None and not orm.listening
    host = Host(every=Node.look_every(orm), listening=orm.listening)
    taker = Taker(host)
    interval = timedelta(seconds=app_settings.POLL_INTERVAL)
    taker.wake()
    taker.tick(PLANNED, NOW)
    assert host.calls == ["read"] and taker.due == NOW + interval and taker.polling
    host.calls.clear()
    taker.tick(PLANNED, taker.due - timedelta(microseconds=1))  # not yet: no look
    assert host.calls == [] and taker.due == NOW + interval
    taker.tick(PLANNED, taker.due)  # the poll finds nothing again: the next is as far
    assert host.calls == ["read"] and taker.due == NOW + 2 * interval and taker.polling

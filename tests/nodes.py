"""Driving an in-process node by hand, as its loop would, in integration tests."""

from __future__ import annotations

from django_cluster_jobs.engine import Node
from django_cluster_jobs.models import JobRun
from tests import timing
from tests.conftest import wait_until


def take_all(node: Node) -> None:
    """Look for pending runs now, as a notification or the poll would."""
    node.taker.wake()
    node.tick()


def is_ended(run: JobRun) -> bool:
    return JobRun.objects.get(pk=run.pk).state not in ("pending", "running")


def served(node: Node, run: JobRun) -> JobRun:
    """Let ``node`` look for pending runs, as its loop does, until ``run`` ended; return it.

    One look may take nothing (the node's estimate of the database's clock can put a run due
    "now" a little ahead of it, or the look fails and is retried): the node's loop then looks
    again at the run's due time, and so does this. It waits on the clock (``wait_until``): a
    test that uses it is marked ``timing``.
    """
    wait_until(lambda: take_all(node) or is_ended(run), timing.RUN_ENDS)
    return JobRun.objects.get(pk=run.pk)

"""Enqueueing inside a transaction: the run is part of it; or, with the helper, after commit."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_cluster_jobs.models import JobRun
from django_cluster_jobs.tasks import enqueue_on_commit
from tests import task_defs

pytestmark = pytest.mark.django_db(transaction=True)


class Rollback(Exception):
    pass


def task_runs() -> int:
    return JobRun.objects.filter(task_path="tests.task_defs.add").count()


def test_an_enqueue_inside_a_rolled_back_transaction_leaves_no_run():
    with pytest.raises(Rollback), transaction.atomic():
        task_defs.add.enqueue(1)
        assert task_runs() == 1  # visible to this transaction only
        raise Rollback
    assert task_runs() == 0


def test_an_enqueue_inside_a_committed_transaction_is_one_run():
    with transaction.atomic():
        result = task_defs.add.enqueue(1)
    assert JobRun.objects.filter(pk=int(result.id)).count() == 1


def test_enqueue_on_commit_waits_for_the_commit():
    with transaction.atomic():
        enqueue_on_commit(task_defs.add, (2,), {"b": 3})
        assert task_runs() == 0
    [run] = JobRun.objects.filter(task_path="tests.task_defs.add")
    assert (run.args, run.kwargs) == ([2], {"b": 3})


def test_enqueue_on_commit_never_enqueues_when_rolled_back():
    with pytest.raises(Rollback), transaction.atomic():
        enqueue_on_commit(task_defs.add, (2,))
        raise Rollback
    assert task_runs() == 0


def test_enqueue_on_commit_outside_a_transaction_enqueues_at_once():
    enqueue_on_commit(task_defs.add, (5,))
    assert task_runs() == 1

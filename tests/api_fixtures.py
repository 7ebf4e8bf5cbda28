"""What the API tests share: clients holding chosen permissions and a small cluster to act on.

Registered as a plugin in ``conftest.py``, so every API test module sees these fixtures.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from django_cluster_jobs.models import EventKind, NodeStatus, Outcome, RunLog, RunState
from tests.factories import (
    JobDefinitionFactory,
    JobRunFactory,
    LeaseFactory,
    RunEventFactory,
    RunningRunFactory,
    WorkerNodeFactory,
)

TRIGGER = "trigger_jobdefinition"
MANAGE = "manage_jobdefinition"
VIEW_ALL = ("view_jobdefinition", "view_jobrun", "view_workernode", "view_lease")
TRACEBACK = 'Traceback (most recent call last):\n  File "jobs.py", line 3\nRuntimeError: boom'


def url(name: str, *args: object) -> str:
    return reverse(f"cluster_jobs_api:{name}", args=args)


def at(minutes: float) -> datetime:
    """A time ``minutes`` from now (negative: ago)."""
    return timezone.now() + timedelta(minutes=minutes)


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def user_with():
    """Return an API client authenticated as a user holding exactly ``codenames``."""

    def make(*codenames: str) -> APIClient:
        user = User.objects.create_user(f"operator{User.objects.count()}")
        user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
        client = APIClient()
        client.force_authenticate(User.objects.get(pk=user.pk))  # a fresh permission cache
        return client

    return make


@pytest.fixture
def viewer(user_with) -> APIClient:
    """May read everything, may neither trigger nor manage."""
    return user_with(*VIEW_ALL)


@pytest.fixture
def operator(user_with) -> APIClient:
    """May read everything, trigger and manage; recorded in the ledger as ``api:operator0``."""
    return user_with(*VIEW_ALL, TRIGGER, MANAGE)


@pytest.fixture
def cluster():
    """A cron job with a success, a failure and a running run, two nodes and a leader."""
    job = JobDefinitionFactory(name="report", cron="0 9 * * *", timezone="Europe/Paris")
    ok = JobRunFactory(job=job, key="k1", scheduled_at=at(-30), state=RunState.SUCCEEDED,
                       node="node-a", outcome=Outcome.WON)  # fmt: skip
    failed = JobRunFactory(
        job=job, key="k2", scheduled_at=at(-20), state=RunState.FAILED, node="node-b",
        outcome=Outcome.CATCH_UP, error="RuntimeError: boom\nmore", traceback=TRACEBACK,
        started_at=at(-20), finished_at=at(-19),
    )  # fmt: skip
    running = RunningRunFactory(job=job, key="k3", scheduled_at=at(-1), node="node-a")
    RunEventFactory(run=failed, kind=EventKind.CLAIMED, at=at(-20), reason="won the slot")
    RunEventFactory(run=failed, kind=EventKind.FAILED, at=at(-19), node="node-b", fence=2)
    RunLog.objects.create(run=failed, at=at(-20), level=logging.WARNING, attempt=1, node="node-b",
                          trace_id="ab" * 16, message="disk almost full")  # fmt: skip
    node_a = WorkerNodeFactory(node_id="node-a", skipped={"disabled": 1})
    node_b = WorkerNodeFactory(node_id="node-b", status=NodeStatus.DRAINING)
    LeaseFactory(name="leader", holder="node-a", fence=4, acquired_at=at(-60), expires_at=at(1))
    return {"job": job, "ok": ok, "failed": failed, "running": running, "node_a": node_a,
            "node_b": node_b}  # fmt: skip

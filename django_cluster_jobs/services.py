"""Service functions: what the admin, the API, the commands and application code call.

Nothing else writes the ledger behind the protocol's back.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from .conf import app_settings
from .coordination import get_coordinator
from .models import (
    EventKind,
    JobDefinition,
    JobRun,
    NodeStatus,
    Outcome,
    RunEvent,
    RunState,
    WorkerNode,
)
from .registry import _check_payload, registry


def definition_for(name: str, using: str | None = None) -> JobDefinition:
    """Return the stored definition of a job, creating it from code if no scheduler has yet."""
    using = using or app_settings.DATABASE
    row = JobDefinition.objects.using(using).filter(name=name).first()
    if row is not None:
        return row
    declared = registry.get(name)  # raises UnknownJob with the registered names
    row, _ = JobDefinition.objects.using(using).get_or_create(
        name=name, defaults={**declared.definition_fields(), "enabled": declared.enabled}
    )
    return row


def enqueue(
    name: str,
    payload: dict[str, Any] | None = None,
    *,
    at: datetime | None = None,
    key: str | None = None,
    priority: int | None = None,
    outcome: str = Outcome.ENQUEUED,
    using: str | None = None,
) -> JobRun:
    """Create a pending run of job ``name``; with ``key``, a second call returns the first run."""
    using = using or app_settings.DATABASE
    definition = definition_for(name, using)
    payload = _check_payload(name, payload or {})
    now = timezone.now()
    due = at or now
    run_key = f"{outcome}:{key}" if key else f"{outcome}:{uuid.uuid4().hex}"
    fields = {
        "scheduled_at": due,
        "due_at": due,
        "state": RunState.PENDING,
        "outcome": outcome,
        "priority": definition.priority if priority is None else priority,
        "payload": payload,
        "created_at": now,
    }
    try:
        with transaction.atomic(using=using):
            run, created = JobRun.objects.using(using).get_or_create(
                job=definition, key=run_key, defaults=fields
            )
            if created:
                transaction.on_commit(get_coordinator(using).notify_pending, using=using)
    except IntegrityError:  # a concurrent caller with the same key won the insert
        run = JobRun.objects.using(using).get(job=definition, key=run_key)
    return run


def request_drain(node_ids: list[str], using: str | None = None) -> int:
    """Ask active nodes to drain; each notices at its next heartbeat. Return how many."""
    using = using or app_settings.DATABASE
    return (
        WorkerNode.objects.using(using)
        .filter(node_id__in=node_ids, status=NodeStatus.ACTIVE)
        .update(status=NodeStatus.DRAINING)
    )


def request_cancel(run: JobRun, by: str = "", using: str | None = None) -> bool:
    """Flag a running run for cancellation; its node sees it at the next heartbeat."""
    using = using or app_settings.DATABASE
    updated = (
        JobRun.objects.using(using)
        .filter(pk=run.pk, state=RunState.RUNNING)
        .update(cancel_requested=True)
    )
    if updated:
        RunEvent.objects.using(using).create(
            run_id=run.pk,
            kind=EventKind.CANCEL_REQUESTED,
            node=by,
            fence=run.fence,
            at=timezone.now(),
        )
    return bool(updated)

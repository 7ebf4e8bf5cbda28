"""Service functions: what the admin, the API, the commands and application code call.

Nothing else writes the ledger behind the protocol's back.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

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
from .registry import registry
from .validation import check_run_inputs, definition_errors, registered

logger = logging.getLogger(__name__)

#: ``paused_until`` of a job paused with no end (until resumed).
FOREVER = datetime(9999, 12, 31, tzinfo=UTC)


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


def cluster_now(using: str | None = None) -> datetime:
    """Return cluster time: the database's clock.

    Callers of these services (a web process, a shell) are not nodes and do not measure their
    clock's offset, so a due time taken from their own clock would be as wrong as that clock.
    """
    return get_coordinator(using or app_settings.DATABASE).db_now()


def _definition_and_now(name: str, using: str) -> tuple[JobDefinition, datetime]:
    """Return the job's stored definition and cluster time, read in one query when it exists."""
    row = JobDefinition.objects.using(using).filter(name=name).annotate(db_now=Now()).first()
    if row is None:
        return definition_for(name, using), cluster_now(using)
    return row, row.db_now


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
    """Create a pending run of job ``name``; with ``key``, a second call returns the first run.

    Without ``at`` the run is due at once on the database's clock, whatever the caller's says.
    Inputs the engine cannot use raise ImproperlyDeclared (InvalidPayload for the payload).
    """
    using = using or app_settings.DATABASE
    definition, now = _definition_and_now(name, using)
    handler = registered(definition.callable_name)
    payload = check_run_inputs(
        name, payload=payload, priority=priority, key=key, at=at, handler=handler
    )
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
    notify = get_coordinator(using).notify_pending
    if not key:  # a fresh random key cannot exist yet: one INSERT, no look-up, no savepoint
        run = JobRun.objects.using(using).create(job=definition, key=run_key, **fields)
        transaction.on_commit(notify, using=using)
        return run
    try:
        with transaction.atomic(using=using):
            run, created = JobRun.objects.using(using).get_or_create(
                job=definition, key=run_key, defaults=fields
            )
            if created:
                transaction.on_commit(notify, using=using)
    except IntegrityError:  # a concurrent caller with the same key won the insert
        run, created = JobRun.objects.using(using).get(job=definition, key=run_key), False
    if not created and run.payload != payload:
        logger.warning(
            "%s: a run with idempotency key %r exists (run %s); it is returned and its payload "
            "kept, and this call's different payload is ignored",
            name,
            key,
            run.pk,
            extra={"job": name},
        )
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
            at=cluster_now(using),
        )
    return bool(updated)


def trigger(
    name: str, payload: dict[str, Any] | None = None, *, by: str = "", using: str | None = None
) -> JobRun:
    """Run a job now, outside its schedule (the admin's "run now"); returns the pending run."""
    run = enqueue(name, payload, outcome=Outcome.MANUAL, using=using)
    if by:
        JobRun.objects.using(run._state.db).filter(pk=run.pk).update(reason=f"triggered by {by}")
    return run


def pause(
    name: str,
    *,
    until: datetime | None = None,
    reason: str = "paused by an operator",
    using: str | None = None,
) -> bool:
    """Stop firing a job (until ``until``, or until resumed); nodes re-plan within a heartbeat.

    Occurrences due before the pause are settled as they stand; none during it is ever run or
    recorded (see docs/explanation/settled-through.md).
    """
    check_run_inputs(name, at=until)
    if problems := definition_errors({"pause_reason": reason}, job=name):
        raise problems[0]
    return _change(name, using, paused_until=until or FOREVER, pause_reason=reason)


def resume(name: str, using: str | None = None) -> bool:
    """Resume a paused job (also a breaker-opened one) at once; nothing from the pause runs."""
    return _change(name, using, paused_until=None, pause_reason="")


def _change(name: str, using: str | None, **fields: Any) -> bool:
    """Change a job's definition through ``save()``, which settles it and moves its mark."""
    using = using or app_settings.DATABASE
    with transaction.atomic(using=using):
        row = JobDefinition.objects.using(using).filter(name=name).first()
        if row is None:
            return False
        for field, value in fields.items():
            setattr(row, field, value)
        row.save(using=using, update_fields=[*fields, "updated_at"])
    return True


def replay(run: JobRun, *, by: str = "", using: str | None = None) -> JobRun:
    """Run a finished (typically dead-lettered) run again as a fresh run linked to it.

    A run whose payload or priority the engine cannot use raises ImproperlyDeclared instead.
    """
    using = using or app_settings.DATABASE
    job = run.job
    check_run_inputs(
        job.name, payload=run.payload, priority=run.priority, handler=registered(job.callable_name)
    )
    now = cluster_now(using)
    fresh = JobRun.objects.using(using).create(
        job_id=run.job_id,
        key=f"{Outcome.REPLAY}:{uuid.uuid4().hex}",
        scheduled_at=run.scheduled_at,
        due_at=now,
        state=RunState.PENDING,
        outcome=Outcome.REPLAY,
        priority=run.priority,
        payload=run.payload,
        origin=run,
        created_at=now,
        reason=f"replay of run {run.pk}",
    )
    RunEvent.objects.using(using).create(
        run_id=run.pk,
        kind=EventKind.REPLAYED,
        node=by,
        at=now,
        reason=f"replayed as run {fresh.pk}",
    )
    transaction.on_commit(get_coordinator(using).notify_pending, using=using)
    return fresh


def set_enabled(names: list[str], *, enabled: bool, using: str | None = None) -> list[str]:
    """Enable or disable jobs by name; nodes re-plan within a heartbeat. Return those changed."""
    using = using or app_settings.DATABASE
    with transaction.atomic(using=using):
        jobs = JobDefinition.objects.using(using).filter(name__in=names).exclude(enabled=enabled)
        changed = list(jobs.values_list("name", flat=True))
        for name in changed:
            _change(name, using, enabled=enabled)
    return changed

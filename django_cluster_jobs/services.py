"""Service functions: what the admin, the API, the commands and application code call.

Nothing else writes the ledger behind the protocol's back.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from .bulk import RunRequest, enqueue_many
from .conf import app_settings
from .coordination import get_vendor
from .exceptions import UnknownJob
from .models import (
    ClusterEvent,
    ClusterEventKind,
    EventKind,
    JobDefinition,
    JobRun,
    NodeStatus,
    Outcome,
    PauseCause,
    RunEvent,
    RunState,
    WorkerNode,
)
from .observe import tracing
from .registry import registry
from .validation import check_run_inputs, definition_errors, registered

__all__ = ["RunRequest", "enqueue_many"]  # re-exported: the bulk form of enqueue

logger = logging.getLogger(__name__)

#: ``paused_until`` of a job paused with no end (until resumed).
FOREVER = datetime(9999, 12, 31, tzinfo=UTC)
#: Room for a run's reason (the column's length).
RUN_REASON_LENGTH = JobRun._meta.get_field("reason").max_length or 200


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
    return get_vendor(using or app_settings.DATABASE).db_now()


@dataclass(frozen=True)
class Target:
    """What an enqueue needs of a job's stored definition, read in one small query."""

    pk: int
    callable_name: str
    priority: int
    now: datetime


def _target(name: str, using: str) -> Target:
    """Return the columns of the job's definition an enqueue uses, and cluster time, in one
    query (the whole row is not read: it is most of the cost of a call)."""
    rows = JobDefinition.objects.using(using).filter(name=name)
    row = rows.values_list("pk", "callable_name", "priority", Now()).first()
    if row is None:
        definition = definition_for(name, using)
        row = (definition.pk, definition.callable_name, definition.priority, cluster_now(using))
    return Target(*row)


def enqueue(
    name: str,
    payload: dict[str, Any] | None = None,
    *,
    at: datetime | None = None,
    key: str | None = None,
    priority: int | None = None,
    outcome: str = Outcome.ENQUEUED,
    by: str = "",
    using: str | None = None,
    columns: dict[str, Any] | None = None,
) -> JobRun:
    """Create a pending run of job ``name``; with ``key``, a second call returns the first run.

    Without ``at`` the run is due at once on the database's clock, whatever the caller's says.
    Inputs the engine cannot use raise ImproperlyDeclared (InvalidPayload for the payload).
    ``columns`` are more run columns, already validated (a django.tasks task's path and args).
    """
    run, _ = get_or_enqueue(
        name, payload, at=at, key=key, priority=priority, outcome=outcome, by=by, using=using,
        columns=columns,
    )  # fmt: skip
    return run


def _asked_by(outcome: str, by: str) -> str:
    """Return a run's reason naming who asked for it: ``triggered by admin:alice``."""
    verb = "triggered" if outcome == Outcome.MANUAL else "enqueued"
    return f"{verb} by {by}" if by else ""


#: (alias, job name) -> the callable its stored definition named when a run of it was last
#: stored: the payload is checked against that handler, and the INSERT stores the run only while
#: the definition still names it (see coordination.inserts).
_CALLABLES: dict[tuple[str, str], str] = {}


def _run(
    name: str,
    payload: Any,
    at: datetime | None,
    outcome: str,
    by: str,
    columns: dict[str, Any] | None,
) -> JobRun:
    """A pending run of ``name`` to store, all but its job, priority and times (which the
    INSERT reads), the payload as given (checked by :func:`_insert_pending`)."""
    run = JobRun(
        key=f"{outcome}:{uuid.uuid4().hex}", state=RunState.PENDING, outcome=outcome,
        payload=payload, reason=_asked_by(outcome, by), **(columns or {}),
        trace_context=tracing.carrier() or None,
    )  # fmt: skip
    run.scheduled_at = run.due_at = at  # type: ignore[assignment] # None: due on the clock
    return run


def _insert_pending(
    vendor: Any, name: str, run: JobRun, payload: Any, priority: int | None
) -> JobRun:
    """Store ``run`` in one statement that reads the job's definition row itself; the first
    call for a job, or one that finds its definition gone or changed, reads it again."""
    place = (vendor.alias, name)
    for _ in range(2):
        callable_name = _CALLABLES.get(place) or _target(name, vendor.alias).callable_name
        handler = registered(callable_name)
        run.payload = check_run_inputs(
            name, payload=payload, priority=priority, at=run.due_at, handler=handler
        )
        stored = vendor.insert_pending(run, name, callable_name, priority)
        if stored is not None:
            _CALLABLES[place] = callable_name
            return stored
        _CALLABLES.pop(place, None)  # deleted or changed since: read the definition again
    raise UnknownJob(name, registry.names())


def get_or_enqueue(
    name: str,
    payload: dict[str, Any] | None = None,
    *,
    at: datetime | None = None,
    key: str | None = None,
    priority: int | None = None,
    outcome: str = Outcome.ENQUEUED,
    by: str = "",
    using: str | None = None,
    columns: dict[str, Any] | None = None,
) -> tuple[JobRun, bool]:
    """Do what :func:`enqueue` does; return the run and whether this call created it."""
    using = using or app_settings.DATABASE
    vendor = get_vendor(using)
    if not key and vendor.features.inserts_pending:  # a fresh random key cannot exist yet
        fresh = _run(name, payload, at, outcome, by, columns)
        return _insert_pending(vendor, name, fresh, payload, priority), True
    definition = _target(name, using)
    now = definition.now
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
        "reason": _asked_by(outcome, by),
        **(columns or {}),
        "trace_context": tracing.carrier() or None,
    }
    notify = get_vendor(using).notify_pending
    if not key:  # a fresh random key cannot exist yet: one INSERT, no look-up, no savepoint
        run = JobRun.objects.using(using).create(job_id=definition.pk, key=run_key, **fields)
        transaction.on_commit(partial(notify, 1), using=using)
        return run, True
    try:
        with transaction.atomic(using=using):
            run, created = JobRun.objects.using(using).get_or_create(
                job_id=definition.pk, key=run_key, defaults=fields
            )
            if created:
                transaction.on_commit(partial(notify, 1), using=using)
    except IntegrityError:  # a concurrent caller with the same key won the insert
        run, created = JobRun.objects.using(using).get(job_id=definition.pk, key=run_key), False
    if not created and run.payload != payload:
        logger.warning(
            "%s: a run with idempotency key %r exists (run %s); it is returned and its payload "
            "kept, and this call's different payload is ignored",
            name,
            key,
            run.pk,
            extra={"job": name},
        )
    return run, created


def request_drain(node_ids: list[str], using: str | None = None, *, by: str = "") -> int:
    """Ask active nodes to drain; each notices at its next heartbeat. Return how many."""
    using = using or app_settings.DATABASE
    with transaction.atomic(using=using):
        nodes = WorkerNode.objects.using(using).filter(
            node_id__in=node_ids, status=NodeStatus.ACTIVE
        )
        asked = list(nodes.select_for_update().values_list("node_id", flat=True))
        WorkerNode.objects.using(using).filter(node_id__in=asked).update(status=NodeStatus.DRAINING)
        for node_id in asked:
            _record_act(using, ClusterEventKind.DRAIN_REQUESTED, node_id, "drain requested", by)
    return len(asked)


def _record_act(using: str, kind: str, node: str, act: str, by: str) -> None:
    """Record an operator's act, naming who acted, as a cluster event (and in the log)."""
    actor = by or "an unnamed caller"
    logger.info("%s by %s", act, actor, extra={"actor": by, "node": node})
    ClusterEvent.objects.using(using).create(
        at=cluster_now(using), kind=kind, node=node, detail=f"{act} by {actor}"[:4000]
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


def cancel_pending(run_ids: Iterable[int], *, by: str = "", using: str | None = None) -> list[int]:
    """Cancel those of ``run_ids`` that are still pending, before any node takes them; return
    the ids cancelled.

    One transaction, compare-and-set on the pending state: a run a node took meanwhile (it is
    running now, or ended) is left as it is, and so is one a node is taking at this moment (its
    row is locked: skipped, not waited for). Each cancelled run's timeline names who cancelled.
    """
    using = using or app_settings.DATABASE
    reason = f"cancelled before it started by {by or 'an unnamed caller'}"
    with transaction.atomic(using=using):
        pending = JobRun.objects.using(using).filter(pk__in=list(run_ids), state=RunState.PENDING)
        locked = pending.order_by("pk").select_for_update(skip_locked=True)  # in one order
        rows = list(locked.values_list("pk", "fence"))
        now = cluster_now(using)
        JobRun.objects.using(using).filter(
            pk__in=[pk for pk, _fence in rows], state=RunState.PENDING
        ).update(state=RunState.CANCELLED, finished_at=now, reason=reason[:RUN_REASON_LENGTH])
        RunEvent.objects.using(using).bulk_create(
            RunEvent(run_id=pk, kind=EventKind.CANCELLED, node=by, fence=fence, reason=reason,
                     at=now)
            for pk, fence in rows
        )  # fmt: skip
    if rows:
        logger.info("%d pending runs cancelled by %s", len(rows), by, extra={"actor": by})
    return [pk for pk, _fence in rows]


def trigger(
    name: str, payload: dict[str, Any] | None = None, *, by: str = "", using: str | None = None
) -> JobRun:
    """Run a job now, outside its schedule (the admin's "run now"); returns the pending run."""
    return enqueue(name, payload, outcome=Outcome.MANUAL, by=by, using=using)


#: Room for a pause's reason (the column's length).
PAUSE_REASON_LENGTH = JobDefinition._meta.get_field("pause_reason").max_length or 200


def pause_reason(reason: str, by: str) -> str:
    """Return a pause's stored reason: the operator's words, then who paused, within the column."""
    if not by:
        return (reason or "paused by an operator")[:PAUSE_REASON_LENGTH]
    signed = f"paused by {by}"
    room = PAUSE_REASON_LENGTH - len(signed) - len(" ()")
    if not reason or room < 2:
        return signed[:PAUSE_REASON_LENGTH]
    if len(reason) > room:
        reason = reason[: room - 1] + "…"
    return f"{reason} ({signed})"


def pause(
    name: str,
    *,
    until: datetime | None = None,
    reason: str = "",
    by: str = "",
    using: str | None = None,
) -> bool:
    """Stop firing a job (until ``until``, or until resumed); nodes re-plan within a heartbeat.

    The stored reason names who paused, as :func:`pause_reason` words it. Occurrences due before
    the pause are settled as they stand; none during it is ever run or recorded (see
    docs/explanation/settled-through.md).
    """
    check_run_inputs(name, at=until)
    if problems := definition_errors({"pause_reason": reason}, job=name):
        raise problems[0]
    reason = pause_reason(reason, by)
    span = f"until {until.isoformat()}" if until else "until resumed"
    return _change(name, using, f"paused {span}", by, paused_until=until or FOREVER,
                   pause_reason=reason, pause_cause=PauseCause.OPERATOR)  # fmt: skip


def resume(name: str, using: str | None = None, *, by: str = "") -> bool:
    """Resume a paused job (also a breaker-opened one) at once; nothing from the pause runs."""
    return _change(name, using, "resumed", by, paused_until=None, pause_reason="",
                   pause_cause=PauseCause.NONE)  # fmt: skip


def _change(name: str, using: str | None, act: str, by: str, **fields: Any) -> bool:
    """Change a job's definition through ``save()``, which settles it and moves its mark, and
    record who did it (a ``job_changed`` cluster event)."""
    using = using or app_settings.DATABASE
    with transaction.atomic(using=using):
        row = JobDefinition.objects.using(using).filter(name=name).first()
        if row is None:
            return False
        for field, value in fields.items():
            setattr(row, field, value)
        row.save(using=using, update_fields=[*fields, "updated_at"])
        _record_act(using, ClusterEventKind.JOB_CHANGED, "", f"{name}: {act}", by)
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
        task_path=run.task_path,
        args=run.args,
        kwargs=run.kwargs,
        origin=run,
        instance=_instance_of(run, using),
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
    transaction.on_commit(partial(get_vendor(using).notify_pending, 1), using=using)
    return fresh


def replay_dead_letter(run_id: int, *, by: str = "", using: str | None = None) -> JobRun | None:
    """Replay a dead-lettered run that was not replayed yet; return its replay, else None.

    The dead run's row is locked while it is checked and replayed, so two operators replaying
    the same dead letters at once replay each only once. Raises ImproperlyDeclared as
    :func:`replay` does, with nothing written.
    """
    using = using or app_settings.DATABASE
    with transaction.atomic(using=using):
        dead = JobRun.objects.using(using).filter(pk=run_id, state=RunState.DEAD)
        # Only the run's row is locked (no FOR UPDATE OF, which MariaDB and MySQL lack).
        run = dead.select_for_update().first()
        if run is None or JobRun.objects.using(using).filter(origin=run).exists():
            return None
        return replay(run, by=by, using=using)


def _instance_of(run: JobRun, using: str) -> int | None:
    """The workflow instance a replay of ``run`` belongs to, so that its success resumes the
    instance: the run's own, or the run itself when it is a root's run; None outside one."""
    if run.instance is not None:
        return run.instance
    leads = JobDefinition.objects.using(using).dependents_of(run.job.name).exists()
    return run.pk if leads else None


def set_enabled(
    names: list[str], *, enabled: bool, by: str = "", using: str | None = None
) -> list[str]:
    """Enable or disable jobs by name; nodes re-plan within a heartbeat. Return those changed."""
    using = using or app_settings.DATABASE
    with transaction.atomic(using=using):
        jobs = JobDefinition.objects.using(using).filter(name__in=names).exclude(enabled=enabled)
        changed = list(jobs.values_list("name", flat=True))
        for name in changed:
            _change(name, using, "enabled" if enabled else "disabled", by, enabled=enabled)
    return changed

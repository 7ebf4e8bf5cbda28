"""Definition changes: each one that alters what is due settles the job and moves its mark.

Saving a JobDefinition (the admin, the services, the scheduler's sync of code jobs, application
code calling ``save()``) goes through :func:`save_definition`:

- a new job's mark is the cluster time of its creation, so nothing from before it exists is due;
- a change of a column in :data:`DUE_FIELDS` first settles the job's unclaimed occurrences up to
  the change's cluster time under the definition as stored (by its misfire policy; a pause or a
  disable only records them missed), then moves the mark to that instant and bumps
  ``revision``, in the same transaction. Claims that nodes planned from an older revision are
  refused. Occurrences before a change follow the old definition, those after it the new one,
  and nothing from before a change is ever caught up under the new one (a pause is never caught
  up at resume, an edited schedule never fires its past).

Every save and every deletion also counts a change on the ``definitions`` counter, which each
node reads with its heartbeat to know when to re-plan; every save writes ``updated_at`` (even
with ``update_fields``), which the node compares with what it loaded to re-plan only the
definitions that changed.

``QuerySet.update()`` and ``bulk_create()`` bypass this, as they bypass ``save()``; the library
never uses them on definitions, except :func:`create_definitions` (which does what saving each
new row would), and the leader still moves the marks of disabled and paused jobs
past what is not due. Running nodes see such a write at their next start.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from django.db import router, transaction
from django.db.models import F

from ..coordination import get_vendor
from ..models import DEFINITIONS, Counter, JobDefinition
from .settle import JOBS_PER_QUERY, next_to_settle, settle

#: Columns whose change alters which occurrences are due.
DUE_FIELDS = (
    "schedule_kind", "cron", "timezone", "interval", "placement", "enabled", "paused_until",
)  # fmt: skip


#: Changes that stop a job: what fell due before them is recorded missed, never run after them.
STOPS = ("paused", "disabled")


def cluster_now(using: str) -> datetime:
    """Return cluster time: the ledger database's clock."""
    return get_vendor(using).db_now()


def due_changed(
    stored: JobDefinition, changed: JobDefinition, written: Collection[str] | None = None
) -> bool:
    """True when saving ``changed`` (only the columns ``written``, if given) over ``stored``
    alters what is due."""
    names = DUE_FIELDS if written is None else [f for f in DUE_FIELDS if f in written]
    return any(getattr(stored, name) != getattr(changed, name) for name in names)


def save_definition(
    definition: JobDefinition, save: Callable[..., None], *args: Any, **kwargs: Any
) -> None:
    """Save ``definition`` with ``save`` (Model.save), keeping its mark's invariant."""
    using = kwargs.get("using") or router.db_for_write(JobDefinition, instance=definition)
    kwargs["using"] = using
    _also_write(kwargs, "updated_at")  # what nodes compare to know which definitions changed
    with transaction.atomic(using=using):
        stored = _locked(using, definition)
        if stored is None:
            if definition.settled_through is None:
                definition.settled_through = cluster_now(using)
            definition.next_to_settle = next_to_settle(definition, definition.settled_through)
        elif due_changed(stored, definition, kwargs.get("update_fields")):
            now, what = cluster_now(using), _what(stored, definition)
            cause = f"not claimed before the job was {what}"
            settle(using, [stored], now, now, cause=cause, record_only=what in STOPS)
            definition.settled_through, definition.revision = now, stored.revision + 1
            written = _as_written(stored, definition, kwargs.get("update_fields"))
            definition.next_to_settle = next_to_settle(written, now)
            _also_write(kwargs, "settled_through", "revision", "next_to_settle")
        else:  # the leader may have moved the mark since this copy was read: never move it back
            definition.settled_through = stored.settled_through
            definition.revision = stored.revision
            definition.next_to_settle = stored.next_to_settle
        save(*args, **kwargs)
        definitions_changed(using)


def create_definitions(using: str, definitions: list[JobDefinition]) -> None:
    """Insert new definitions in batched statements, as saving each would: each settled through
    the cluster time of its creation, one change counted. Call inside a transaction."""
    now = cluster_now(using)
    for definition in definitions:
        definition.settled_through = now
        definition.next_to_settle = next_to_settle(definition, now)
    JobDefinition.objects.using(using).bulk_create(definitions, batch_size=JOBS_PER_QUERY)
    definitions_changed(using)


def definitions_changed(using: str) -> None:
    """Count a change to the job definitions, in the caller's transaction: every node's next
    heartbeat reads the counter and re-plans."""
    counters = Counter.objects.using(using)
    if not counters.filter(name=DEFINITIONS).update(value=F("value") + 1):
        counters.get_or_create(name=DEFINITIONS, defaults={"value": 1})  # deleted: start again


def definition_deleted(sender: type, instance: JobDefinition, using: str, **kwargs: Any) -> None:
    """post_delete receiver: a deleted definition is a change too (however it was deleted)."""
    definitions_changed(using)


def _locked(using: str, definition: JobDefinition) -> JobDefinition | None:
    """Return the stored row, locked until the transaction ends; None for a new one."""
    if definition.pk is None or definition._state.adding:
        return None
    rows = JobDefinition.objects.using(using).filter(pk=definition.pk)
    vendor = get_vendor(using)
    if vendor.connection.features.has_select_for_update:
        rows = rows.select_for_update(no_key=vendor.features.no_key_locks)
    return rows.first()


def _as_written(
    stored: JobDefinition, changed: JobDefinition, written: Collection[str] | None
) -> JobDefinition:
    """The definition as it will be stored once ``changed`` is saved (only ``written``)."""
    if written is None:
        return changed
    view = copy.copy(stored)
    for name in written:
        setattr(view, name, getattr(changed, name))
    return view


def _also_write(kwargs: dict[str, Any], *names: str) -> None:
    fields = kwargs.get("update_fields")
    if fields is not None:
        kwargs["update_fields"] = {*fields, *names}


def _what(stored: JobDefinition, changed: JobDefinition) -> str:
    """Name the change in the reasons of the rows it settles."""
    if stored.enabled != changed.enabled:
        return "enabled" if changed.enabled else "disabled"
    if stored.paused_until != changed.paused_until:
        return "resumed" if changed.paused_until is None else "paused"
    return "rescheduled"

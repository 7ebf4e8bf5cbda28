"""A node's row in the registry of nodes, and the code-declared jobs it copies to the database."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version

from django.db import DatabaseError, OperationalError, transaction

from ..coordination import is_lock_timeout
from ..ledger.changes import create_definitions
from ..ledger.settle import JOBS_PER_QUERY
from ..models import JobDefinition, NodeStatus, Source, WorkerNode
from ..registry import Job
from ..stored import UNREADABLE
from .executor import release_broken_connections

logger = logging.getLogger("django_cluster_jobs.engine.node")

#: What storing one code job may raise because of its row: it is logged and left out.
SYNC_ERRORS: tuple[type[Exception], ...] = (DatabaseError, *UNREADABLE)

#: Seconds a starting node waits out a busy SQLite database ("database is locked").
BUSY_WAIT = 60.0


def package_version() -> str:
    try:
        return version("django-cluster-jobs")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def register(alias: str, node_id: str, tags: Iterable[str], now: datetime, process: str) -> int:
    """Record the node as active, started now, in this process; return its row's id. Waits out
    a database busy with other writers."""
    deadline = time.monotonic() + BUSY_WAIT
    while True:
        try:
            return _register(alias, node_id, tags, now, process)
        except OperationalError as exc:
            if not is_lock_timeout(exc) or time.monotonic() > deadline:
                raise
            logger.warning("database busy while %s registers; waiting", node_id,
                           extra={"node": node_id})  # fmt: skip
            release_broken_connections()
            time.sleep(0.5)


def _register(alias: str, node_id: str, tags: Iterable[str], now: datetime, process: str) -> int:
    row, _ = WorkerNode.objects.using(alias).update_or_create(
        node_id=node_id,
        defaults={
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "process": process,
            "version": package_version(),
            "tags": sorted(tags),
            "status": NodeStatus.ACTIVE,
            "started_at": now,
            "last_heartbeat": now,
            "stopped_at": None,
        },
    )
    return row.pk


def previous_registration(alias: str, node_id: str) -> tuple[int, str] | None:
    """The row id and process identity this node id was last registered with, if any."""
    return (
        WorkerNode.objects.using(alias).filter(node_id=node_id).values_list("pk", "process").first()
    )


def set_status(alias: str, node_id: str, **fields: object) -> None:
    """Update the node's row; a database error is logged, the node goes on stopping."""
    try:
        WorkerNode.objects.using(alias).filter(node_id=node_id).update(**fields)
    except DatabaseError:
        logger.warning("could not update node %s (%s)", node_id, fields.get("status", ""),
                       exc_info=True, extra={"node": node_id})  # fmt: skip


def sync_definitions(jobs: Iterable[Job], alias: str) -> None:
    """Upsert every code-declared job; an operator's enabled flag on an existing row is kept.

    A row of the same name that an operator created (source database) is never taken over: the
    code job is left out and the conflict logged (``manage.py check`` reports it too). A job
    whose row cannot be stored is logged and left out; the others are synced.

    The stored rows are read in a few statements; the new jobs are inserted in batches and only
    the rows that differ from their declaration are saved, so a start with many unchanged jobs
    costs a handful of statements, not several per job.
    """
    declared = list(jobs)
    try:
        stored = _stored(alias, [d.name for d in declared])
    except UNREADABLE:  # a row Django cannot read: one by one
        _sync_each(declared, alias)
        return
    _create(alias, [d for d in declared if d.name not in stored])
    _sync_each([d for d in declared if d.name in stored and _differs(d, stored[d.name])], alias)


def _stored(alias: str, names: list[str]) -> dict[str, JobDefinition]:
    """The stored rows of these job names, by name."""
    rows = JobDefinition.objects.using(alias)
    found: dict[str, JobDefinition] = {}
    for start in range(0, len(names), JOBS_PER_QUERY):
        found.update(
            (r.name, r) for r in rows.filter(name__in=names[start : start + JOBS_PER_QUERY])
        )
    return found


def _differs(declared: Job, row: JobDefinition) -> bool:
    """True when the stored row is not this code job as declared (or is an operator's)."""
    if row.source != Source.CODE:
        return True
    return any(getattr(row, k) != v for k, v in declared.definition_fields().items())


def _create(alias: str, new: list[Job]) -> None:
    """Insert the rows of jobs never stored before, as saving each would, in one transaction;
    if it fails (a bad row, another node inserting the same jobs) they are stored one by one,
    so one bad job leaves only itself out."""
    if not new:
        return
    rows = [JobDefinition(name=d.name, enabled=d.enabled, **d.definition_fields()) for d in new]
    try:
        with transaction.atomic(using=alias):
            create_definitions(alias, rows)
    except DatabaseError as exc:
        if is_lock_timeout(exc):
            raise
        _sync_each(new, alias)


def _sync_each(jobs: Iterable[Job], alias: str) -> None:
    for declared in jobs:
        try:
            _sync_one(declared, alias)
        except SYNC_ERRORS as exc:  # its row cannot be written, or read
            if is_lock_timeout(exc):
                raise
            logger.error("job %r cannot be stored (%s); it is not scheduled", declared.name, exc,
                         extra={"job": declared.name},
                         exc_info=not isinstance(exc, DatabaseError))  # fmt: skip


def _sync_one(declared: Job, alias: str) -> None:
    fields = declared.definition_fields()
    with transaction.atomic(using=alias):
        row, created = JobDefinition.objects.using(alias).get_or_create(
            name=declared.name, defaults={**fields, "enabled": declared.enabled}
        )
        if created:
            return
        if row.source != Source.CODE:
            logger.error(
                "job %r is declared in code (%s) but an operator's database job has that name; "
                "the database job is kept and the code job is not scheduled",
                declared.name,
                declared.origin,
                extra={"job": declared.name},
            )
            return
        changed = [k for k, v in fields.items() if getattr(row, k) != v]
        if changed:
            for name in changed:
                setattr(row, name, fields[name])
            row.save(using=alias, update_fields=[*changed, "updated_at"])

"""Bulk enqueue: many pending runs of one job in one INSERT, all or nothing.

Every item passes the same validator as :func:`services.enqueue`; the first invalid one stops
the call before anything is written, and its error names the item's index. Idempotency keys
work as they do for one run: a key that exists returns the existing run, and a key repeated
inside one call gives every repeat the run of its first occurrence.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction

from .coordination import get_vendor
from .exceptions import ImproperlyDeclared, InvalidPayload
from .models import JobRun, Outcome, RunState
from .run_request import RunRequest
from .validation import check_run_inputs, registered

#: How many times a bulk insert is retried when a concurrent caller inserted one of its keys
#: between the look-up and the insert (each retry looks the keys up again).
KEY_RACE_RETRIES = 3


def _request(item: Any) -> RunRequest:
    """An item as a RunRequest: a RunRequest as it is, anything else as a payload."""
    return item if isinstance(item, RunRequest) else RunRequest(payload=item)


def _checked(name: str, index: int, item: RunRequest, handler: Any) -> dict:
    """Return the item's payload as stored; raise its validation error, naming the index."""
    try:
        return check_run_inputs(
            name,
            payload=item.payload,
            priority=item.priority,
            key=item.key,
            at=item.at,
            handler=handler,
        )
    except InvalidPayload as exc:
        raise InvalidPayload(name, value=exc.value, hint=f"item {index}: {exc.hint}") from None
    except ImproperlyDeclared as exc:
        where = f"{exc.field} of item {index}"
        raise ImproperlyDeclared(name, where, exc.value, exc.hint) from None


def enqueue_many(
    name: str,
    items: Iterable[Mapping[str, Any] | RunRequest],
    *,
    at: datetime | None = None,
    priority: int | None = None,
    outcome: str = Outcome.ENQUEUED,
    by: str = "",
    using: str | None = None,
) -> list[JobRun]:
    """Create a pending run of job ``name`` per item, in one INSERT; return them in item order.

    An item is a payload (a mapping) or a :class:`RunRequest`; ``at`` and ``priority`` apply to
    the items that do not set their own. Nothing is stored if any item is invalid.
    """
    from .services import _asked_by, _target  # services re-exports this function

    using = using or _default_alias()
    target = _target(name, using)
    handler = registered(target.callable_name)
    requests = [_request(item) for item in items]
    check_run_inputs(name, priority=priority, at=at)
    payloads = [_checked(name, i, r, handler) for i, r in enumerate(requests)]
    keys = [f"{outcome}:{r.key}" if r.key else f"{outcome}:{uuid.uuid4().hex}" for r in requests]
    fresh: dict[str, JobRun] = {}
    for request, payload, key in zip(requests, payloads, keys, strict=True):
        due = request.at or at or target.now
        chosen = request.priority if request.priority is not None else priority
        fresh.setdefault(key, JobRun(
            job_id=target.pk, key=key, scheduled_at=due, due_at=due, state=RunState.PENDING,
            outcome=outcome, priority=target.priority if chosen is None else chosen,
            payload=payload, created_at=target.now, reason=_asked_by(outcome, by),
        ))  # fmt: skip
    stored = _insert(using, target.pk, fresh, any(r.key for r in requests))
    return [stored[key] for key in keys]


def _default_alias() -> str:
    from .conf import app_settings

    return app_settings.DATABASE


def _insert(using: str, job_id: int, fresh: dict[str, JobRun], keyed: bool) -> dict[str, JobRun]:
    """Insert the runs whose keys do not exist yet, in one statement; return every key's run.

    With no caller's key every key is a fresh UUID and cannot exist: no look-up is made.
    """
    for attempt in range(KEY_RACE_RETRIES + 1):
        try:
            with transaction.atomic(using=using):
                existing = _existing(using, job_id, list(fresh)) if keyed else {}
                new = [run for key, run in fresh.items() if key not in existing]
                for run in new:
                    run.set_rank()  # bulk_create calls no save()
                JobRun.objects.using(using).bulk_create(new)
                if any(run.pk is None for run in new):  # a database that returns no ids
                    new = list(_existing(using, job_id, [run.key for run in new]).values())
                if new:
                    notify = partial(get_vendor(using).notify_pending, len(new))
                    transaction.on_commit(notify, using=using)
            return {**{run.key: run for run in new}, **existing}
        except IntegrityError:  # a concurrent caller inserted one of the keys: look again
            if attempt == KEY_RACE_RETRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _existing(using: str, job_id: int, keys: list[str]) -> dict[str, JobRun]:
    """The runs of the job that already hold one of ``keys``."""
    runs = JobRun.objects.using(using).filter(job_id=job_id, key__in=keys)
    return {run.key: run for run in runs}

"""Enqueueing when a transaction commits (Django 6.0 removed ``ENQUEUE_ON_COMMIT``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction


def enqueue_on_commit(
    task: Any,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    using: str | None = None,
) -> None:
    """Enqueue ``task`` with ``args`` and ``kwargs`` once the transaction on ``using`` commits;
    never if it rolls back. Outside a transaction it enqueues at once.

    The ledger's run row is written in the caller's transaction anyway when TASKS and your data
    share a database (see docs/howto/tasks.md); this helper is for data in another database, or
    for code that must not hold the ledger's row in its transaction.
    """
    arguments = list(args), dict(kwargs or {})
    transaction.on_commit(lambda: task.enqueue(*arguments[0], **arguments[1]), using=using)

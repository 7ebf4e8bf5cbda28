"""Lifecycle signals the ledger sends for writes it makes on behalf of no handler."""

from __future__ import annotations

from django.db import transaction

from ..models import JobRun


def after_commit(alias: str, name: str, pk: int, node: str, **kwargs: object) -> None:
    """Send the lifecycle signal ``name`` for run ``pk`` once the current transaction commits."""
    transaction.on_commit(lambda: _send(alias, name, pk, node, **kwargs), using=alias)


def _send(alias: str, name: str, pk: int, node: str, **kwargs: object) -> None:
    from .. import signals

    run = JobRun.objects.using(alias).select_related("job").filter(pk=pk).first()
    if run is not None:
        signals.send(
            getattr(signals, name),
            run.job.name,
            run_id=pk,
            key=run.key,
            node=node,
            attempt=run.attempt,
            **kwargs,
        )

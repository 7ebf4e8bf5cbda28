"""Entry points for claim races in real processes (spawned, so each sets Django up itself)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from tests.timing import scaled


def claim_in_process(
    kind: str, job_id: int, keys: list[str], node: str, start: object, out: object
) -> None:
    """Wait for ``start``, claim every key in one batch, put the keys won on ``out``."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connections

    from django_cluster_jobs.coordination import Claim, get_vendor

    vendor = get_vendor(kind=kind)
    now = datetime.now(UTC)
    claims = [Claim(job_id, key, now) for key in keys]
    connections["default"].ensure_connection()
    start.wait(scaled(30))  # type: ignore[attr-defined]
    won = vendor.claim(claims, node, now, now + timedelta(seconds=30))
    out.put((node, sorted(w.key for w in won)))  # type: ignore[attr-defined]
    connections.close_all()

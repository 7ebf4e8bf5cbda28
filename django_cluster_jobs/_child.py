"""Entry point of a process-executor child; imports nothing of Django before setting it up."""

from __future__ import annotations

import logging
import traceback
from typing import Any


def main(job: str, fields: dict[str, Any], payload: dict, out: Any) -> None:
    """Entry point of the child: set Django up, run the handler, send back the outcome."""
    import django

    django.setup()
    from django.db import connections

    from .context import RunContext
    from .engine.runner import jsonable
    from .registry import registry

    declared = registry.get(fields["callable_name"])
    logger = logging.LoggerAdapter(
        logging.getLogger(f"django_cluster_jobs.jobs.{job}"),
        {"job": job, "run_id": fields["run_id"]},
    )
    ctx = RunContext(
        **{k: v for k, v in fields.items() if k != "callable_name"}, payload=payload, logger=logger
    )
    try:
        out.send(("ok", jsonable(declared.invoke(ctx, payload)), "", "", ""))
    except Exception as exc:
        out.send(
            (
                "error",
                None,
                f"{type(exc).__name__}: {exc}",
                traceback.format_exc(),
                type(exc).__name__,
            )
        )
    finally:
        connections.close_all()

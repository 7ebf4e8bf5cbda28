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
    from .engine.handlers import call, safe_text, storable
    from .engine.runlog import PipeSink, RunLogger
    from .registry import registry

    declared = registry.get(fields["callable_name"])
    logger = RunLogger(
        logging.getLogger(f"django_cluster_jobs.jobs.{job}"),
        {"job": job, "run_id": fields["run_id"]},
        PipeSink(out),
    )
    ctx = RunContext(
        **{k: v for k, v in fields.items() if k != "callable_name"}, payload=payload, logger=logger
    )
    try:
        out.send(("ok", storable(call(declared, ctx, payload)), "", "", ""))
    except BaseException as exc:  # SystemExit too: the parent records it
        error, trace = f"{type(exc).__name__}: {exc}", traceback.format_exc()
        out.send(("error", None, safe_text(error), safe_text(trace), type(exc).__name__))
    finally:
        connections.close_all()

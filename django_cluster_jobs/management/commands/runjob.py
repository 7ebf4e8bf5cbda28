"""``manage.py runjob NAME``: run one occurrence of a job in the foreground, claimed once.

Meant for an external clock such as a Kubernetes CronJob: the arrival time (now, or ``--at``) is
snapped to the nearest occurrence of the job's schedule, and only the first delivery for that
occurrence runs it. Exit status: 0 when the run succeeded or the occurrence was already claimed
(or the job is disabled, paused, or a previous run is live), 1 when the handler failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...engine.oneshot import OneShot, Result
from ...exceptions import ImproperlyDeclared, UnknownJob
from ...validation import check_run_inputs
from .runscheduler import configure_logging


def json_object(text: str) -> dict[str, Any]:
    """Parse --payload: a JSON object, whose keys become the handler's keyword arguments."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"not valid JSON ({exc}); pass an object such as '{{\"user_id\": 42}}'"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object of keyword arguments, not a {type(value).__name__}: {text}"
        )
    return value


def aware_datetime(text: str) -> datetime:
    """Parse --at: an ISO-8601 time with a UTC offset (Z or ±hh:mm)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO-8601 time; use e.g. 2026-05-28T09:00:00Z"
        ) from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no UTC offset; add one, e.g. {text}Z or {text}+02:00"
        )
    return value


@contextmanager
def foreground(shot: OneShot, verbosity: int) -> Iterator[None]:
    """Log like runscheduler and cancel the handler on SIGTERM or Ctrl-C; restore both after,
    so that call_command() leaves the calling process as it found it."""
    package = logging.getLogger("django_cluster_jobs")
    level = package.level
    added = configure_logging(verbosity, shot.node_id)
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, lambda *_: shot.cancel()) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        package.setLevel(level)
        if added is not None:
            package.removeHandler(added)


def describe(result: Result) -> str:
    """Return the one-line account of what runjob did."""
    where = f"{result.job} @ {result.key}"
    if result.ran:
        line = f"run {result.run_id} of {where} on {result.node}: {result.ended}"
        if result.error:
            line += f" ({result.error})"
        if result.state == "pending":
            line += "; pending again for a retry"
        return line
    if result.run_id is None:
        return f"{where}: not run, {result.reason}"
    return (
        f"{where}: not run, already claimed by run {result.run_id} "
        f"on {result.node or 'no node yet'} ({result.state})"
    )


class Command(BaseCommand):
    help = (
        "Run one occurrence of a job now, in the foreground, claimed through the ledger so that "
        "a doubled delivery runs it once. The arrival time is snapped to the nearest occurrence "
        "of the job's schedule; jobs without slots (on demand, startup, fixed delay) are keyed by "
        "the arrival time rounded to the second, or by --key."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="The job's name.")
        parser.add_argument(
            "--payload",
            type=json_object,
            help="Keyword arguments as a JSON object, e.g. '{\"user_id\": 42}'.",
        )
        parser.add_argument(
            "--at",
            type=aware_datetime,
            help="The arrival time, ISO-8601 with an offset (default: now); snapped to the "
            "nearest occurrence.",
        )
        parser.add_argument(
            "--key",
            help="Claim the key external:KEY instead of the occurrence's (an idempotency key).",
        )
        parser.add_argument(
            "--node-id",
            help="The node id recorded on the run (default: CLUSTER_JOBS['NODE_ID'], else the "
            "host name and pid).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            shot = OneShot(options["name"], node_id=options["node_id"])
        except UnknownJob as exc:
            raise CommandError(str(exc)) from None
        try:
            inputs = {key: options[key] for key in ("payload", "at", "key")}
            check_run_inputs(shot.name, handler=shot.planned.job, **inputs)
            with foreground(shot, options["verbosity"]):
                result = shot.run(options["payload"], at=options["at"], key=options["key"])
        except ImproperlyDeclared as exc:  # InvalidPayload too
            raise CommandError(str(exc)) from None
        if not result.ok:
            raise CommandError(describe(result), returncode=1)
        self.stdout.write(describe(result))

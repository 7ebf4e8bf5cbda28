"""``manage.py runscheduler``: run this process as one scheduler node of the cluster."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...bounds import SETTING_SECONDS_MAX
from ...checks import LONGEST, setting_problem
from ...conf import app_settings
from ...engine import Node
from ...observe import metrics
from ...observe.probes import ProbeServer


def _checked(key: str, value: object) -> None:
    """Refuse an option's value that the setting it overrides could not take (the same rule)."""
    if problem := setting_problem(key, value):
        raise argparse.ArgumentTypeError(f"{problem} (as CLUSTER_JOBS[{key!r}]), got {value!r}")


def node_id(text: str) -> str:
    _checked("NODE_ID", text)
    return text


def threads(text: str) -> int:
    value = int(text)
    _checked("EXECUTOR_THREADS", value)
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def duration(text: str) -> float:
    """Seconds, 0 to SETTING_SECONDS_MAX: the timer that stops the node must accept them."""
    value = float(text)
    if not 0 <= value <= SETTING_SECONDS_MAX:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds, 0 to {LONGEST}, got {value!r}"
        )
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 0 to 65535, got {value}")
    return value


def tag_set(text: str) -> frozenset[str]:
    tags = frozenset(t.strip() for t in text.split(",") if t.strip())
    _checked("NODE_TAGS", tags)
    return tags


LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


def configure_logging(verbosity: int, node_id: str) -> logging.Handler | None:
    """Log the package's records at the level --verbosity asks for; return the handler added.

    A handler (stderr, one line per record naming the node) is added only when the project
    configured none that the package's records reach; the project's own handlers, levels of
    other loggers and propagation are left as they are.
    """
    package = logging.getLogger("django_cluster_jobs")
    package.setLevel(LEVELS.get(verbosity, logging.DEBUG))
    if package.hasHandlers():
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s [{node_id}] %(levelname)s %(message)s", datefmt="%H:%M:%S")
    )
    package.addHandler(handler)
    return handler


class Command(BaseCommand):
    help = "Run a scheduler node: claim due occurrences through the database and run what it wins."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--node-id",
            type=node_id,
            help="This node's id (default: CLUSTER_JOBS['NODE_ID'], "
            "else pod or host name and pid).",
        )
        parser.add_argument("--threads", type=threads, help="Executor threads.")
        parser.add_argument("--tags", type=tag_set, help="Comma-separated node tags.")
        parser.add_argument(
            "--max-ticks", type=positive_int, help="Stop after this many loop iterations (tests)."
        )
        parser.add_argument(
            "--duration", type=duration, help="Stop gracefully after this many seconds."
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="Start, fire startup jobs and what is due now, then stop.",
        )
        parser.add_argument(
            "--probe-port",
            type=port,
            help="Serve /livez, /readyz, /startupz and /metrics on this port "
            "(default: CLUSTER_JOBS['PROBE_PORT'], else none).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        node = Node(options["node_id"], threads=options["threads"], tags=options["tags"])
        configure_logging(options["verbosity"], node.node_id)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: node.request_stop(reason="signal"))
        max_ticks = 1 if options["once"] else options["max_ticks"]
        port = options["probe_port"]
        port = port if port is not None else app_settings.PROBE_PORT
        recorder = metrics.for_node(node) if port is not None else None
        probes = self._probes(node, port, recorder)
        try:
            node.run(max_ticks=max_ticks, duration=options["duration"])
        finally:
            if probes is not None:
                probes.stop()
            if recorder is not None:
                recorder.disconnect()
        if node.failure:
            raise CommandError(f"node {node.node_id} stopped: {node.failure}", returncode=1)

    def _probes(
        self, node: Node, port: int | None, recorder: metrics.NodeMetrics | None
    ) -> ProbeServer | None:
        """Start the probe server (with /metrics when prometheus-client is installed) before
        the node starts, so /startupz answers meanwhile."""
        if port is None:
            return None
        exposition = recorder.exposition if recorder is not None else None
        probes = ProbeServer(node.health, port, metrics=exposition)
        probes.start()
        return probes

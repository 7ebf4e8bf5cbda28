"""``manage.py schedulerstatus``: nodes, the leader, jobs with next and last runs, recent failures.

``--json`` prints the same report as one JSON object (keys in django_cluster_jobs.status).
``--check`` makes it a readiness or liveness probe: the exit status is 1 unless at least one
active node heartbeated within DEAD_AFTER seconds (measured on the database's clock).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...status import build_status


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _run(run: dict[str, Any] | None) -> str:
    if run is None:
        return "-"
    return f"{run['state']} {run['finished_at'] or run['scheduled_at']} (run {run['id']})"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]  # fmt: skip


def node_lines(report: dict[str, Any]) -> list[str]:
    nodes = report["nodes"]
    health = "healthy" if report["healthy"] else "NOT HEALTHY"
    lines = [
        f"Nodes: {len(nodes)} ({health}: an active node must heartbeat within "
        f"{report['dead_after_seconds']:g} s)"
    ]
    if nodes:
        head = ["NODE", "STATUS", "HEARTBEAT", "RUNNING", "CLOCK OFFSET", "HOST"]
        rows = [
            [
                n["node_id"],
                n["status"],
                f"{n['heartbeat_age_seconds']:.1f} s ago",
                str(n["running_runs"]),
                f"{n['clock_offset_ms']:+.1f} ms",
                f"{n['host']}:{n['pid']}",
            ]
            for n in nodes
        ]
        lines += _table([head, *rows])
    return lines


def leader_line(report: dict[str, Any]) -> str:
    leader = report["leader"]
    if leader is None:
        return "Leader: none (no node holds the leader lease)"
    return f"Leader: {leader['holder']} since {leader['since']} (fence {leader['fence']})"


def job_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"Jobs: {len(report['jobs'])}"]
    for job in report["jobs"]:
        state = "enabled" if job["enabled"] else "disabled"
        if job["paused"]:
            state += f", paused until {job['paused_until']}"
        lines.append(f"  {job['name']}: {job['description']} [{state}]")
        lines.append(
            f"    next {job['next_fire_time'] or '-'} | last run {_run(job['last_run'])} | "
            f"last success {_run(job['last_success'])} | last failure {_run(job['last_failure'])}"
        )
        lines += [f"    INVALID: {problem}" for problem in job["problems"]]
    return lines


def failure_lines(report: dict[str, Any]) -> list[str]:
    failures = report["recent_failures"]
    lines = [f"Recent failures: {len(failures)}"]
    for run in failures:
        lines.append(
            f"  run {run['id']} {run['job']} @ {run['key']}: {run['state']} "
            f"{run['finished_at'] or run['scheduled_at']} on {run['node'] or '-'}"
            + (f": {run['error']}" if run["error"] else "")
        )
    return lines


def render_text(report: dict[str, Any]) -> str:
    """Return the report as the human-readable text schedulerstatus prints."""
    lines = [f"Cluster status at {report['generated_at']}", *node_lines(report)]
    lines += [leader_line(report), *job_lines(report), *failure_lines(report)]
    lines += [f"UNREADABLE: {row['message']}" for row in report.get("unreadable", [])]
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Show the scheduler cluster: nodes, the leader, jobs with their next and last runs, and "
        "recent failures. --check exits 1 unless an active node heartbeated within DEAD_AFTER "
        "seconds (a readiness probe)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")
        parser.add_argument(
            "--failures",
            type=non_negative_int,
            default=10,
            help="How many recent failures to list (default 10).",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Exit with status 1 unless an active node heartbeated within DEAD_AFTER seconds.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = build_status(failures=options["failures"])
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
        else:
            self.stdout.write(render_text(report))
        if options["check"] and not report["healthy"]:
            raise CommandError(
                f"no active node heartbeated within {report['dead_after_seconds']:g} s",
                returncode=1,
            )

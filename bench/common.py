"""What every bench script shares: Django set-up on a clean ledger, scheduler subprocesses with
hard deadlines, percentiles, and the printed header and tables."""

from __future__ import annotations

import math
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = Path("/tmp/bench")
DEFAULT_DATABASE_URL = "sqlite:////tmp/bench/bench.sqlite3"


def setup(jobs: str = "") -> None:
    """Configure Django with bench.settings, migrate, and empty the ledger tables."""
    import django

    os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["BENCH_JOBS"] = jobs
    WORK.mkdir(parents=True, exist_ok=True)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    wipe()


def recreate_database(url: str) -> None:
    """Drop the PostgreSQL database ``url`` names (closing its sessions) and create it empty.

    Only for a database of the bench's own: everything in it is lost."""
    import psycopg

    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def wipe() -> None:
    """Empty the app's tables. PostgreSQL: TRUNCATE, so no dead rows from earlier runs slow this
    one down; elsewhere DELETE in one transaction (the foreign keys are checked at its commit)."""
    from django.apps import apps
    from django.db import connection, transaction

    tables = [
        connection.ops.quote_name(m._meta.db_table)
        for m in apps.get_app_config("cluster_jobs").get_models()
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {', '.join(tables)}")
            return
        for table in tables:
            cursor.execute(f"DELETE FROM {table}")


def database_label() -> str:
    """The database vendor, server version and where it is."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            version = cursor.fetchone()[0].split()[0]
        where = f"{s.get('HOST') or 'socket'}:{s.get('PORT') or 5432}/{s['NAME']}"
        return f"PostgreSQL {version} ({where})"
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            mode = cursor.fetchone()[0]
            cursor.execute("PRAGMA synchronous")
            sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(cursor.fetchone()[0], "?")
        return f"SQLite {sqlite3.sqlite_version} ({s['NAME']}, journal {mode}, synchronous {sync})"
    return f"{connection.vendor} ({s['NAME']})"


def header(script: str, what: str) -> None:
    """Print what is measured, where, with which versions, when and on what machine."""
    import django

    from django_cluster_jobs import __version__

    try:
        import psycopg

        driver = f", psycopg {psycopg.__version__}"
    except ImportError:  # pragma: no cover - SQLite-only installs
        driver = ""
    rows = [
        ("measures", what),
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("database", database_label()),
        (
            "software",
            f"Python {platform.python_version()}, Django {django.__version__}{driver}, "
            f"django-cluster-jobs {__version__}",
        ),
        ("code", code_state()),
        ("machine", f"{os.cpu_count()} cores, {load()}"),
    ]
    print(f"\n== bench/{script} ==")
    for key, value in rows:
        print(f"{key:<10} {value}")


def code_state() -> str:
    """The commit the package was measured at, and whether its files had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "django_cluster_jobs"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"commit {head}" + (" + uncommitted changes in django_cluster_jobs/" if dirty else "")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min)"


def pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print rows under headers in aligned columns; floats get 3 significant decimals."""
    text = [[fmt(v) for v in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)
    ]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in text:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def note(text: str) -> None:
    print(f"note: {text}")


class Scheduler:
    """A real ``python -m django runscheduler`` process on the bench database, always reaped."""

    def __init__(self, node_id: str, *args: str, log_name: str, **env: str) -> None:
        self.node_id = node_id
        self.log = WORK / "logs" / f"{log_name}-{node_id}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        child_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "PYTHONPATH": str(ROOT),
            **env,
        }
        cmd = [sys.executable, "-m", "django", "runscheduler", "--node-id", node_id, *args]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=child_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, signum)

    def wait(self, timeout: float) -> int | None:
        """Wait for exit; SIGKILL it after ``timeout`` seconds. Return the exit code."""
        try:
            return self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


def reap(schedulers: Iterable[Scheduler]) -> None:
    """SIGKILL whatever is still running (the bench's last resort; figures are already taken)."""
    for scheduler in schedulers:
        scheduler.kill()


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until truthy; return its value, or None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    return None


def ms(seconds: float) -> float:
    return seconds * 1000.0

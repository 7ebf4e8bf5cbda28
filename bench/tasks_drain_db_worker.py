"""The same django.tasks drain as bench/tasks_drain.py, through django-tasks-db's db_worker.

    python3 -m venv /tmp/tasks-db-venv
    /tmp/tasks-db-venv/bin/pip install "Django>=5.2,<5.3" django-tasks django-tasks-db \\
        "psycopg[binary]" django-environ
    /tmp/tasks-db-venv/bin/python bench/tasks_drain_db_worker.py --tasks 10000

django-tasks-db is never a dependency of the package: this runs in a venv of its own, with the
settings of bench/settings_tasks_db.py. Drops and recreates the PostgreSQL database ``taskbench``
(``DATABASE_URL`` names another; all its data is lost) and migrates it. Enqueues N tasks of the
same no-op ``bench.tasks.noop`` through ``django_tasks_db.DatabaseBackend``, one ``enqueue()``
call each, from one thread, with no worker running (timed). Then starts the ``db_worker``
processes with ``--batch`` (each exits once it finds the queue empty; otherwise their defaults:
a log line when a task starts and when it ends, as runscheduler's default verbosity logs each
run's start and end) and waits for them to exit. The figures come from the stored results'
``enqueued_at``, ``started_at`` and ``finished_at``, as bench/tasks_drain.py reads its runs'.

db_worker runs one task at a time: it has no option for threads (django-tasks-db 0.13.0). The
closest equivalent of 2 workers x 4 threads is 8 processes, ``--workers 2 --processes-per-worker
4`` (the default); ``--processes-per-worker 1`` runs 2 single-task workers.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common  # noqa: E402
from bench.tasks_drain import DEFAULT_URL, report  # noqa: E402


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--processes-per-worker", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900.0)
    return parser.parse_args()


def header(what: str) -> None:
    import django

    rows = [
        ("measures", what),
        ("date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("database", common.database_label()),
        (
            "software",
            f"Python {platform.python_version()}, Django {django.__version__}, "
            f"django-tasks {version('django-tasks')}, django-tasks-db {version('django-tasks-db')}"
            f", psycopg {version('psycopg')}",
        ),
        ("code", common.code_state()),
        ("machine", f"{os.cpu_count()} cores, {common.load()}"),
    ]
    print("\n== bench/tasks_drain_db_worker.py ==")
    for key, value in rows:
        print(f"{key:<10} {value}")


def main() -> None:
    args = arguments()
    os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_tasks_db"
    common.recreate_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_tasks_db.models import DBTaskResult

    from bench.tasks import noop

    processes = args.workers * args.processes_per_worker
    header(
        f"{args.tasks} no-op django.tasks through django_tasks_db.DatabaseBackend, "
        f"{processes} db_worker processes ({args.workers} workers x "
        f"{args.processes_per_worker} processes; db_worker has no threads)"
    )
    n = args.tasks
    started = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    enqueue_seconds = time.perf_counter() - started

    logs = common.WORK / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(common.ROOT)}
    launched = time.time()
    workers = []
    for i in range(1, processes + 1):
        cmd = [sys.executable, "-m", "django", "db_worker", "--batch", "--worker-id", f"w{i}"]
        with (logs / f"tasks_drain_db_worker-w{i}.log").open("wb") as out:
            workers.append(subprocess.Popen(cmd, cwd=common.ROOT, env=env, stdout=out,
                                            stderr=subprocess.STDOUT))  # fmt: skip
    deadline = time.monotonic() + args.timeout
    try:
        codes = [w.wait(timeout=max(0.0, deadline - time.monotonic())) for w in workers]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=10)

    results = DBTaskResult.objects.filter(task_path="bench.tasks.noop")
    runs = list(results.values_list("enqueued_at", "started_at", "finished_at"))
    count = results.filter(status="SUCCESSFUL").count()
    report(n, enqueue_seconds, launched, runs, count)
    if codes is None or any(codes) or count < n:
        common.note(f"{count} of {n} succeeded; exit codes {codes} (None: timed out)")
    common.note(f"load at the end: {common.load()}")


if __name__ == "__main__":
    main()

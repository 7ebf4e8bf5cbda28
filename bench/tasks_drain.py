"""django.tasks through our backend: enqueue rate, drain rate, enqueue -> start p50 / p99.

    .venv/bin/python bench/tasks_drain.py --tasks 10000

Drops and recreates the PostgreSQL database ``taskbench`` (``DATABASE_URL`` names another; all
its data is lost) and migrates it. Enqueues N tasks of the no-op ``bench.tasks.noop`` through
``ClusterJobsBackend``, one ``noop.enqueue()`` call each, from one thread, with no node running
(timed: the enqueue rate). Then starts 2 ``runscheduler`` processes with ``--threads 4``
(EXECUTOR_THREADS 4), waits until every run has succeeded and stops them. From the stored runs:
the drain rate (N from the first start to the last finish) and the latency from ``created_at``
(enqueued) to ``started_at`` (taken by a node). bench/tasks_drain_db_worker.py is its twin for
django-tasks-db's ``db_worker``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/taskbench"
TASK = "bench.tasks.noop"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600.0)
    return parser.parse_args()


def succeeded() -> int:
    from django_cluster_jobs.models import JobRun

    return JobRun.objects.filter(task_path=TASK, state="succeeded").count()


def main() -> None:
    args = arguments()
    os.environ.setdefault("DATABASE_URL", DEFAULT_URL)
    common.recreate_database(os.environ["DATABASE_URL"])
    common.setup()
    from bench.tasks import noop
    from django_cluster_jobs.models import JobRun
    from django_cluster_jobs.tasks import compat

    common.header(
        "tasks_drain.py",
        f"{args.tasks} no-op django.tasks through ClusterJobsBackend ({compat.SOURCE}), "
        f"{args.nodes} runscheduler x {args.threads} threads",
    )
    n = args.tasks
    started = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    enqueue_seconds = time.perf_counter() - started

    launched = time.time()
    nodes = [
        common.Scheduler(f"t{i}", "--threads", str(args.threads), "--duration",
                         f"{args.timeout + 30:g}", log_name="tasks_drain")
        for i in range(1, args.nodes + 1)
    ]  # fmt: skip
    try:
        done = common.wait_for(lambda: succeeded() >= n, args.timeout, 0.5)
        for node in nodes:
            node.signal(15)
        codes = [node.wait(30) for node in nodes]
    finally:
        common.reap(nodes)

    runs = list(
        JobRun.objects.filter(task_path=TASK).values_list("created_at", "started_at", "finished_at")
    )
    report(n, enqueue_seconds, launched, runs, succeeded())
    if not done:
        common.note(f"only {succeeded()} of {n} succeeded in {args.timeout:g} s; exits {codes}")
    common.note(f"load at the end: {common.load()}")


def report(n: int, enqueue_seconds: float, launched: float, runs: list, count: int) -> None:
    """Print the figures both twins print, from (enqueued, started, finished) of each task."""
    starts = [s for _, s, _ in runs if s]
    ends = [f for _, _, f in runs if f]
    first, last = min(starts), max(ends)
    drain = (last - first).total_seconds()
    waits = [common.ms((s - e).total_seconds()) for e, s, _ in runs if s]
    print()
    common.table(
        ["tasks", "done", "enqueue/s", "drain s", "drain/s", "launch→last s",
         "enq→start p50 ms", "p99 ms", "max ms"],
        [[n, count, n / enqueue_seconds, drain, count / drain, last.timestamp() - launched,
          common.pct(waits, 0.5), common.pct(waits, 0.99), max(waits)]],
    )  # fmt: skip
    common.note(
        f"enqueue took {enqueue_seconds:.1f} s; the first start came "
        f"{first.timestamp() - launched:.2f} s after the workers were launched"
    )


if __name__ == "__main__":
    main()

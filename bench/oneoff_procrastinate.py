"""The same drain as bench/oneoff.py, with procrastinate, for comparison (its own venv only).

    python3 -m venv /tmp/bench-venv; /tmp/bench-venv/bin/pip install procrastinate psycopg-binary
    /tmp/bench-venv/bin/python bench/oneoff_procrastinate.py --sizes 2000,10000,20000

procrastinate is never a dependency of the package: this script runs in the bench's own
environment, on a database of its own (``procbench``, created if absent, its tables emptied).
It defers N no-op jobs with ``batch_defer`` (timed: the bulk enqueue rate), starts 2 worker
processes with concurrency 4 that exit when the queue is empty, and times the drain from the
first job's start to the last job's end (procrastinate's own events), then times N single
``defer`` calls.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import procrastinate
import psycopg

CONNINFO = os.environ.get("PROCRASTINATE_DSN", "postgresql://postgres@127.0.0.1:5432/procbench")
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=CONNINFO))


@app.task(name="noop")
def noop() -> None:
    """Do nothing: the drain measures the queue, not the work."""


def prepare() -> None:
    admin = CONNINFO.rsplit("/", 1)[0] + "/postgres"
    name = CONNINFO.rsplit("/", 1)[1]
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(CONNINFO, autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0]:
            with app.open():
                app.schema_manager.apply_schema()


def wipe() -> None:
    with psycopg.connect(CONNINFO, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_events, procrastinate_jobs CASCADE")


def drain(n: int, nodes: int, concurrency: int) -> list:
    wipe()
    with app.open():
        started = time.perf_counter()
        noop.batch_defer(*[{} for _ in range(n)])
        bulk = n / (time.perf_counter() - started)
    cmd = [sys.executable, __file__, "--worker", str(concurrency)]
    workers = [subprocess.Popen(cmd) for _ in range(nodes)]
    for worker in workers:
        worker.wait(timeout=900)
    with psycopg.connect(CONNINFO) as conn:
        first, last, done = conn.execute(
            "SELECT min(at) FILTER (WHERE type = 'started'), max(at) FILTER (WHERE type = "
            "'succeeded'), count(*) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
        ).fetchone()
    seconds = (last - first).total_seconds()
    return [n, done, round(seconds, 3), round(done / seconds, 1), round(bulk, 1)]


def single(n: int) -> float:
    wipe()
    with app.open():
        started = time.perf_counter()
        for _ in range(n):
            noop.defer()
        return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2000,10000,20000")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--enqueue", type=int, default=1000)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        app.run_worker(concurrency=args.worker, wait=False, install_signal_handlers=False)
        return
    prepare()
    print(f"procrastinate {procrastinate.__version__}: {args.nodes} workers x {args.concurrency}")
    print("backlog  done  seconds  runs/s  batch_defer runs/s")
    for n in (int(s) for s in args.sizes.split(",")):
        print("  ".join(str(v) for v in drain(n, args.nodes, args.concurrency)))
    print(f"defer, one call per job: {single(args.enqueue):.1f} jobs/s")


if __name__ == "__main__":
    main()

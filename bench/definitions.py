"""What the number of defined jobs costs a node: start, tick, re-plan, memory, catch-up.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/defsbench python bench/definitions.py
    DATABASE_URL=sqlite:////tmp/bench/defs.sqlite3 python bench/definitions.py

For each N (``--jobs 10,1000,10000``) a fresh process empties the ledger, declares N/2 jobs in
code and stores N/2 in the database (both daily cron or fixed-rate schedules that are not due
while it measures, except ``--due`` per-minute jobs), starts one Node and measures, on the
main thread's connection only (the node's own threads are stopped once its first leader chores
are done): the start (sync of the code jobs, the first load and plan), a tick with nothing due
and a tick that also looks for pending runs, the re-plan after one definition changed (jobs
pushed onto the plan again), the process's memory, and three leader catch-up passes: regular
ones a minute after the start and a minute later, then one over every job (as with each purge).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common  # noqa: E402

TICKS = 200


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="10,1000,10000", help="comma-separated job counts")
    parser.add_argument("--due", type=int, default=3, help="jobs due every minute")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


class Statements:
    """Counts the statements this thread's connection sends (an execute wrapper)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MB, from /proc."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def define(n: int, due: int) -> None:
    """Declare n/2 code jobs and store n/2 database jobs; ``due`` of them fire every minute."""
    from django_cluster_jobs import job
    from django_cluster_jobs.models import JobDefinition, ScheduleKind, Source
    from django_cluster_jobs.services import cluster_now

    def noop() -> None:
        return None

    code = n // 2
    for i in range(code):
        cron = "* * * * *" if i < due else f"{i % 60} 3 * * *"
        job(name=f"defs.code.{i:05d}", cron=cron)(noop)
    now = cluster_now()
    rows = [
        JobDefinition(
            name=f"defs.db.{i:05d}",
            callable_name="bench.noop",
            source=Source.DATABASE,
            schedule_kind=ScheduleKind.EVERY,
            interval=timedelta(days=1),
            settled_through=now,
        )
        for i in range(n - code)
    ]
    JobDefinition.objects.bulk_create(rows, batch_size=500)


def stage(text: str) -> None:
    """Say on stderr what the measuring process does (for a run that takes long)."""
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def measure(n: int, due: int) -> dict:
    from django.db import connection

    import django_cluster_jobs.engine.node as node_module
    from django_cluster_jobs.engine import Node
    from django_cluster_jobs.engine.catchup import catch_up
    from django_cluster_jobs.models import JobDefinition

    stage(f"{n} jobs: defining")
    define(n, due)
    stage("starting the node")
    out: dict = {"jobs": n}
    timings: dict[str, float] = {}
    sync = node_module.sync_definitions

    def timed_sync(*args, **kwargs):
        began = time.perf_counter()
        sync(*args, **kwargs)
        timings["sync"] = time.perf_counter() - began

    node_module.sync_definitions = timed_sync
    node = Node("defs-node")
    counter = Statements()
    began = time.perf_counter()
    with connection.execute_wrapper(counter):
        node.start()
    out["start_s"] = time.perf_counter() - began
    out["sync_s"] = timings["sync"]
    out["start_statements"] = counter.count
    out["planned"] = len(node.planned)
    out["rss_mb"], out["peak_rss_mb"] = rss_mb()
    stage("waiting for the first leader chores")
    deadline = time.monotonic() + 300
    while node.leader._next_catch_up == float("-inf") and time.monotonic() < deadline:
        time.sleep(0.05)  # the new leader's first chores (a full catch-up pass) on its thread
    out["first_chores_s"] = time.perf_counter() - began
    node._supervise = lambda: None  # no restart of the stopped threads by the next tick
    for thread in node._threads():
        thread.stop(timeout=30)
    stage("ticks")
    out.update(ticks(node))
    stage("re-plan")
    out.update(replan(node, JobDefinition))
    stage("catch-up passes")
    out.update(catch_ups(node, catch_up))
    out["rss_end_mb"], out["peak_rss_end_mb"] = rss_mb()
    node.stop()
    return out


def ticks(node) -> dict:
    """Median time and mean statements of a tick with nothing due, and of one that looks for
    pending runs (what a polling node does every POLL_INTERVAL)."""
    from django.db import connection

    result = {}
    for label, look in (("tick", False), ("tick_look", True)):
        counter, times = Statements(), []
        with connection.execute_wrapper(counter):
            for _ in range(TICKS):
                if look:
                    node.taker.due = node.clock.now()
                began = time.perf_counter()
                node.tick()
                times.append(time.perf_counter() - began)
        result[f"{label}_ms"] = common.ms(statistics.median(times))
        result[f"{label}_statements"] = counter.count / TICKS
    return result


def replan(node, definitions) -> dict:
    """Change one database job's schedule, then the re-plan its heartbeat asks for."""
    from django.db import connection

    pushes = []
    push = node.claimer.planner.push

    def counted_push(due, name):
        pushes.append(name)
        push(due, name)

    node.claimer.planner.push = counted_push
    changed = definitions.objects.filter(source="database").order_by("pk").first()
    changed.interval = timedelta(hours=12)
    changed.save()
    counter = Statements()
    node.request_reload()  # what the heartbeat does on seeing the definitions counter move
    began = time.perf_counter()
    with connection.execute_wrapper(counter):
        node.tick()
    return {
        "replan_ms": common.ms(time.perf_counter() - began),
        "replan_statements": counter.count,
        "replanned_jobs": len(set(pushes)),
    }


def catch_ups(node, catch_up) -> dict:
    """Leader passes, timed: two regular ones (a minute after the start, then one catch-up period
    later), and one over every job (as at each purge), where the code has that distinction."""
    import inspect

    from django.db import connection

    names, result = node.job_names(), {}
    regular = "everything" in inspect.signature(catch_up).parameters
    base = node.clock.now()
    passes = [("catchup1", 60, False), ("catchup2", 120, False), ("catchup_all", 180, True)]
    for label, later, everything in passes:
        options = {"everything": everything} if regular else {}
        counter = Statements()
        began = time.perf_counter()
        with connection.execute_wrapper(counter):
            at = base + timedelta(seconds=later)
            written = catch_up("default", names, node.node_id, at, **options)
        result[f"{label}_ms"] = common.ms(time.perf_counter() - began)
        result[f"{label}_statements"] = counter.count
        result[f"{label}_rows"] = written
    return result


def child(n: int, due: int) -> None:
    common.setup()
    print(json.dumps(measure(n, due)), flush=True)


def run_child(n: int, due: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(common.ROOT)}
    cmd = [sys.executable, __file__, "--child", str(n), "--due", str(due)]
    done = subprocess.run(
        cmd, cwd=common.ROOT, env=env, stdout=subprocess.PIPE, text=True, timeout=1800,
        check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the measuring process for {n} jobs failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


ROWS = [
    ("node start: start() to first plan, s", "start_s"),
    ("  of which syncing the code jobs, s", "sync_s"),
    ("  statements sent by start()", "start_statements"),
    ("jobs planned", "planned"),
    ("start to the first leader chores done, s", "first_chores_s"),
    ("tick, nothing due: median ms", "tick_ms"),
    ("  statements per tick", "tick_statements"),
    ("tick looking for pending runs: median ms", "tick_look_ms"),
    ("  statements per tick", "tick_look_statements"),
    ("re-plan after one definition changed: ms", "replan_ms"),
    ("  statements", "replan_statements"),
    ("  jobs re-planned (pushed again)", "replanned_jobs"),
    ("RSS after start, MB", "rss_mb"),
    ("peak RSS at the end, MB", "peak_rss_end_mb"),
    ("catch-up pass 1 (a minute after the start): ms", "catchup1_ms"),
    ("  statements", "catchup1_statements"),
    ("  rows written", "catchup1_rows"),
    ("catch-up pass 2 (a minute later): ms", "catchup2_ms"),
    ("  statements", "catchup2_statements"),
    ("  rows written", "catchup2_rows"),
    ("catch-up pass over every job (with a purge): ms", "catchup_all_ms"),
    ("  statements", "catchup_all_statements"),
    ("  rows written", "catchup_all_rows"),
]


def main() -> None:
    args = arguments()
    if args.child is not None:
        child(args.child, args.due)
        return
    common.setup()
    counts = [int(n) for n in args.jobs.split(",")]
    common.header(
        "definitions.py",
        f"cost of {', '.join(map(str, counts))} defined jobs (half code, half database; "
        f"{args.due} due every minute) on one node, default settings",
    )
    results = [run_child(n, args.due) for n in counts]
    print()
    headers = ["figure", *(f"{r['jobs']} jobs" for r in results)]
    if len(results) > 1:
        headers.append(f"{results[-1]['jobs']} / {results[0]['jobs']}")
    rows = []
    for label, key in ROWS:
        row = [label, *(r[key] for r in results)]
        if len(results) > 1:
            first, last = results[0][key], results[-1][key]
            row.append(f"{last / first:.2f}x" if first else "-")
        rows.append(row)
    common.table(headers, rows)
    common.note(
        "statements are those of the main thread's connection (the node's loop, the "
        "catch-up called there); the node's own threads are stopped after their first "
        "chores. RSS from /proc/self/status (VmRSS, VmHWM) of the measuring process."
    )
    common.note(f"load at the end: {common.load()}")


if __name__ == "__main__":
    main()

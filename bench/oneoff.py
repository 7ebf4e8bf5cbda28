"""One-off throughput: drain of a backlog of no-op runs, statements per run, enqueue rates.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/benchdb python bench/oneoff.py

For each backlog size: empty the ledger, store N pending runs of ``bench.noop`` (in one bulk
insert, not timed), start 2 ``runscheduler`` processes x 4 threads, and time the drain from the
first start to the last finish, with the statements the nodes sent per run. Then the enqueue
rate: one ``services.enqueue`` call per run, and ``services.enqueue_many`` where it exists.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common, counting  # noqa: E402

JOB = "bench.noop"
COUNTS = common.WORK / "counts" / "oneoff"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,10000,20000")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--enqueue", type=int, default=1000, help="runs for the enqueue rates")
    parser.add_argument("--timeout", type=float, default=300.0)
    return parser.parse_args()


def seed(n: int) -> None:
    """Store ``n`` pending runs due now, as a backlog (ranked where the branch ranks)."""
    from django_cluster_jobs.models import JobRun
    from django_cluster_jobs.services import cluster_now, definition_for

    job, now = definition_for(JOB), cluster_now()
    runs = [
        JobRun(
            job_id=job.pk,
            key=f"enqueued:{uuid.uuid4().hex}",
            scheduled_at=now,
            due_at=now,
            state="pending",
            outcome="enqueued",
            created_at=now,
        )
        for _ in range(n)
    ]
    for run in runs:
        getattr(run, "set_rank", lambda: None)()
    JobRun.objects.bulk_create(runs, batch_size=2000)
    try:  # the wipe emptied the counters: say the ranks are current, as the migration does
        from django_cluster_jobs.models import Counter
        from django_cluster_jobs.ranks import AGING_COUNTER, aging_us
    except ImportError:  # code that stores no rank
        return
    Counter.objects.update_or_create(name=AGING_COUNTER, defaults={"value": aging_us()})


def finished() -> int:
    from django_cluster_jobs.models import JobRun

    return JobRun.objects.filter(job__name=JOB, state="succeeded").count()


def drain(n: int, args: argparse.Namespace) -> list:
    """Drain a backlog of ``n``; return a row of the drain table."""
    import shutil

    from django.db.models import Max, Min

    from django_cluster_jobs.models import JobRun

    common.wipe()
    seed(n)
    shutil.rmtree(COUNTS, ignore_errors=True)
    nodes = [
        common.Scheduler(f"o{i}", "--threads", str(args.threads), "--duration",
                         f"{args.timeout + 30:g}", log_name="oneoff", BENCH_COUNT_TO=str(COUNTS))
        for i in range(1, args.nodes + 1)
    ]  # fmt: skip
    try:
        done = common.wait_for(lambda: finished() >= n, args.timeout, 0.2)
        for node in nodes:
            node.signal(15)
        codes = [node.wait(30) for node in nodes]
    finally:
        common.reap(nodes)
    span = JobRun.objects.filter(job__name=JOB).aggregate(a=Min("started_at"), b=Max("finished_at"))
    seconds = (span["b"] - span["a"]).total_seconds() if span["a"] and span["b"] else float("nan")
    statements = counting.load_dumps(str(COUNTS))
    total = sum(statements.values())
    work = sum(
        c for k, c in statements.items() if k not in (counting.COMMIT, "transaction control")
    )
    count = finished()
    if not done:
        common.note(f"only {count} of {n} finished in {args.timeout:g} s; exit codes {codes}")
    return [n, count, seconds, count / seconds, total / max(1, count), work / max(1, count)]


def enqueue_rates(n: int) -> list[list]:
    from django_cluster_jobs import services

    common.wipe()
    services.definition_for(JOB)
    started = time.perf_counter()
    for _ in range(n):
        services.enqueue(JOB)
    rows = [["services.enqueue, one call per run", n, n / (time.perf_counter() - started)]]
    if hasattr(services, "enqueue_many"):
        for size in (n, 10 * n):
            started = time.perf_counter()
            services.enqueue_many(JOB, [{} for _ in range(size)])
            rows.append([f"services.enqueue_many, {size} in one call", size,
                         size / (time.perf_counter() - started)])  # fmt: skip
    return rows


def main() -> None:
    args = arguments()
    common.setup()
    sizes = [int(s) for s in args.sizes.split(",")]
    common.header("oneoff.py", f"drain of {sizes} no-op runs, {args.nodes} nodes x {args.threads}")
    rows = [drain(n, args) for n in sizes]
    print()
    common.table(["backlog", "done", "seconds", "runs/s", "stmts/run", "stmts/run w/o tx"], rows)
    print()
    common.table(["enqueue", "runs", "per second"], enqueue_rates(args.enqueue))
    common.note(f"load at the end: {common.load()}; other test suites share this machine")


if __name__ == "__main__":
    main()

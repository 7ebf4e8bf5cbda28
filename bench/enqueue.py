"""One-off runs: enqueue rate, claim-and-complete rate, and enqueue-to-start latency.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/benchdb python bench/enqueue.py

Starts 4 ``runscheduler`` processes with 4 executor threads each, waits until they are up, then
enqueues N one-off runs of the no-op job ``bench.noop`` from this process as fast as one thread
can (``services.enqueue``), and waits (bounded) until all are finished. With --backlog the runs
are enqueued before the nodes start, which measures how fast the cluster drains a queue.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common, counting  # noqa: E402

JOB = "bench.noop"
COUNTS = common.WORK / "counts" / "enqueue"
FINISHED = ("succeeded", "failed", "dead", "lost", "cancelled", "timed_out")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=60.0, help="most seconds to wait")
    parser.add_argument("--backlog", action="store_true", help="enqueue before the nodes start")
    return parser.parse_args()


def start_nodes(args: argparse.Namespace) -> list[common.Scheduler]:
    shutil.rmtree(COUNTS, ignore_errors=True)
    return [
        common.Scheduler(
            f"q{i}",
            "--threads",
            str(args.threads),
            "--duration",
            f"{args.timeout + 30:g}",
            log_name="enqueue",
            BENCH_COUNT_TO=str(COUNTS),
        )
        for i in range(1, args.nodes + 1)
    ]


def nodes_ready(count: int) -> bool:
    """True once every node registered and the first has beaten (its LISTEN is up by then)."""
    from django_cluster_jobs.models import WorkerNode

    return WorkerNode.objects.filter(status="active").count() >= count


def enqueue_all(n: int) -> float:
    """Enqueue ``n`` runs one call each; return the seconds it took."""
    from django_cluster_jobs.services import enqueue

    log = counting.install()
    started = time.perf_counter()
    for _ in range(n):
        enqueue(JOB)
    seconds = time.perf_counter() - started
    per_call = Counter(k for _, k, _ in log.between(0, float("inf")))
    common.note(
        "statements per enqueue() call: "
        + ", ".join(f"{kind} {c / n:.2f}" for kind, c in per_call.most_common())
    )
    return seconds


def finished_count() -> int:
    from django_cluster_jobs.models import JobRun

    return JobRun.objects.filter(job__name=JOB, state__in=FINISHED).count()


def measure(args: argparse.Namespace) -> tuple[float, list[int | None]]:
    """Run the scenario; return the enqueue seconds and the nodes' exit codes."""
    nodes: list[common.Scheduler] = []
    try:
        if not args.backlog:
            nodes = start_nodes(args)
            if not common.wait_for(lambda: nodes_ready(args.nodes), 30):
                sys.exit(f"the nodes did not come up; see {common.WORK / 'logs'}")
            time.sleep(1.0)  # each node's LISTEN connection opens right after registering
        seconds = enqueue_all(args.runs)
        if args.backlog:
            nodes = start_nodes(args)
        done = common.wait_for(lambda: finished_count() >= args.runs, args.timeout, 0.2)
        if not done:
            common.note(f"only {finished_count()} of {args.runs} finished in {args.timeout:g} s")
        for node in nodes:
            node.signal(15)  # SIGTERM: drain and stop, which writes the statement counts
        return seconds, [node.wait(30) for node in nodes]
    finally:
        common.reap(nodes)


def report(enqueue_seconds: float, codes: list, args: argparse.Namespace) -> None:
    from django_cluster_jobs.models import JobRun

    runs = list(
        JobRun.objects.filter(job__name=JOB).values(
            "created_at", "started_at", "finished_at", "state", "node", "result"
        )
    )
    done = [r for r in runs if r["finished_at"] and r["started_at"]]
    to_start = [common.ms((r["started_at"] - r["created_at"]).total_seconds()) for r in done]
    to_handler = [
        common.ms(r["result"]["handler_started"] - r["created_at"].timestamp())
        for r in done
        if isinstance(r["result"], dict)
    ]
    first = min(r["created_at"] for r in runs)
    last_start = max((r["started_at"] for r in done), default=first)
    last_end = max((r["finished_at"] for r in done), default=first)
    started_from = min((r["started_at"] for r in done), default=first)
    rows = [
        ["enqueued (one thread, services.enqueue)", len(runs), len(runs) / enqueue_seconds],
        [
            "claimed and completed, first enqueue -> last finish",
            len(done),
            len(done) / max(1e-9, (last_end - first).total_seconds()),
        ],
        [
            "claimed and completed, first start -> last finish",
            len(done),
            len(done) / max(1e-9, (last_end - started_from).total_seconds()),
        ],
    ]
    print()
    common.table(["rate", "runs", "per second"], rows)
    print()
    lat = [
        [label, len(v), common.pct(v, 0.5), common.pct(v, 0.99), max(v, default=float("nan"))]
        for label, v in (
            ("enqueue -> started_at (taken by a node)", to_start),
            ("enqueue -> handler start", to_handler),
        )
    ]
    common.table(["latency", "runs", "p50 ms", "p99 ms", "max ms"], lat)
    per_node = Counter(r["node"] for r in done)
    last = (last_start - first).total_seconds()
    common.note(
        f"states {dict(Counter(r['state'] for r in runs))}; runs per node "
        f"{dict(sorted(per_node.items()))}; last start {last:.2f} s "
        f"after the first enqueue; node exit codes {codes}"
    )
    statements = counting.load_dumps(str(COUNTS))
    total = sum(n for k, n in statements.items() if k != counting.COMMIT)
    common.note(
        f"the {args.nodes} nodes sent {total} statements ({total / max(1, len(done)):.1f} per run):"
    )
    for kind, n in statements.most_common():
        print(f"      {n:7d}  {kind}")


def main() -> None:
    args = arguments()
    common.setup()
    mode = "enqueued before the nodes start (backlog)" if args.backlog else "nodes already up"
    common.header(
        "enqueue.py",
        f"{args.runs} one-off runs of a no-op job on {args.nodes} nodes x {args.threads} threads, "
        f"{mode}",
    )
    from django_cluster_jobs.services import definition_for

    definition_for(JOB)
    seconds, codes = measure(args)
    report(seconds, codes, args)
    common.note(f"load at the end: {common.load()}; other test suites share this machine")


if __name__ == "__main__":
    main()

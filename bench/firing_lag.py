"""Firing lag of a per-second job on 3 real scheduler processes sharing one database.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/benchdb python bench/firing_lag.py

Starts ``python -m django runscheduler`` 3 times with the bench settings (library defaults) and
the per-second cron job ``bench.every_second``, lets them run ~20 s, then reads the ledger:
lag = started_at - scheduled_at (the node's clock when it sent the claim, stored by it) and
handler start - scheduled_at (the handler's own clock, stored as its result); duplicates and
missed seconds; and the statements the processes sent, by kind.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common, counting  # noqa: E402

JOB = "bench.every_second"
COUNTS = common.WORK / "counts" / "firing_lag"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="each node's --duration")
    return parser.parse_args()


def run_cluster(nodes: int, seconds: float) -> list[int | None]:
    """Start the nodes, wait for them to stop (SIGKILL past a deadline); return exit codes."""
    shutil.rmtree(COUNTS, ignore_errors=True)
    started = [
        common.Scheduler(
            f"n{i}",
            "--duration",
            f"{seconds:g}",
            log_name="firing_lag",
            BENCH_JOBS="every_second",
            BENCH_COUNT_TO=str(COUNTS),
        )
        for i in range(1, nodes + 1)
    ]
    deadline = time.monotonic() + seconds + 45
    try:
        return [s.wait(deadline - time.monotonic()) for s in started]
    finally:
        common.reap(started)


def lags(runs: list[dict]) -> tuple[list[float], list[float]]:
    claimed = [common.ms((r["started_at"] - r["scheduled_at"]).total_seconds()) for r in runs]
    handler = [
        common.ms(r["result"]["handler_started"] - r["scheduled_at"].timestamp())
        for r in runs
        if isinstance(r["result"], dict) and "handler_started" in r["result"]
    ]
    return claimed, handler


def missing_seconds(instants: list) -> list:
    if not instants:
        return []
    present = set(instants)
    span = int((instants[-1] - instants[0]).total_seconds())
    every = (instants[0] + timedelta(seconds=i) for i in range(span + 1))
    return [t for t in every if t not in present]


def report(runs: list[dict], codes: list[int | None], args: argparse.Namespace) -> None:
    claimed, handler = lags(runs)
    rows = [
        [label, len(v), common.pct(v, 0.5), common.pct(v, 0.99), max(v, default=float("nan"))]
        for label, v in (
            ("due -> claim sent (started_at)", claimed),
            ("due -> handler start", handler),
        )
    ]
    print()
    common.table(["lag of each run", "runs", "p50 ms", "p99 ms", "max ms"], rows)
    instants = sorted(r["scheduled_at"] for r in runs)
    doubled = sum(n - 1 for n in Counter(instants).values() if n > 1)
    missed = missing_seconds(instants)
    states = Counter(r["state"] for r in runs)
    wins = Counter(r["node"] for r in runs)
    common.note(
        f"{len(runs)} runs from {instants[0]:%H:%M:%S} to {instants[-1]:%H:%M:%S}; "
        f"duplicates: {doubled}; missed seconds: {len(missed)} {[f'{t:%S}' for t in missed]}; "
        f"states {dict(states)}; won per node {dict(sorted(wins.items()))}; exit codes {codes}"
    )
    statements = counting.load_dumps(str(COUNTS))
    claims = statements.get("claim (slot INSERT … ON CONFLICT)", 0)
    total = sum(n for k, n in statements.items() if k != counting.COMMIT)
    common.note(
        f"the {args.nodes} processes sent {total} statements in all; "
        f"{claims} claim statements for {len(runs)} occurrences "
        f"({claims / max(1, len(runs)):.2f} per occurrence: every node claims, one wins)"
    )
    for kind, n in statements.most_common():
        print(f"      {n:6d}  {kind}")


def main() -> None:
    args = arguments()
    common.setup()
    common.header(
        "firing_lag.py",
        f"firing lag of a per-second cron job, {args.nodes} runscheduler processes "
        f"x {args.seconds:g} s, library defaults (4 threads, heartbeat 5 s)",
    )
    codes = run_cluster(args.nodes, args.seconds)
    from django_cluster_jobs.models import JobRun

    runs = list(
        JobRun.objects.filter(job__name=JOB).values(
            "scheduled_at", "started_at", "node", "state", "result"
        )
    )
    if not runs:
        sys.exit(f"no run of {JOB} was recorded; see {common.WORK / 'logs'}")
    report(runs, codes, args)
    common.note(f"load at the end: {common.load()}; other test suites share this machine")


if __name__ == "__main__":
    main()

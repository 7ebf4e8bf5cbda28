"""Statements an idle node sends per minute, heartbeats included, with the default settings.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/benchdb python bench/idle.py [--scenario S]

Runs one Node in this process and counts every statement its threads send through Django, by
kind, over a steady-state window that starts after a warm-up. Scenarios: ``none`` (no job due),
``minutely`` (one cron job due at each minute), ``saturated`` (every executor thread busy with a
long run and one more run pending: a node that cannot take work, between due times). On
PostgreSQL the server's transaction count for the bench database (pg_stat_database) is read at
both ends of the window as a cross-check.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common, counting  # noqa: E402

#: Statement kinds that take work: any of them between due times would be polling.
CLAIMING = (
    "claim (slot INSERT … ON CONFLICT)",
    "pending take (UPDATE … RETURNING)",
    "pending check (MIN due_at)",
)


SCENARIOS = {
    "none": "no job due",
    "minutely": "one job due at every minute (bench.minutely)",
    "saturated": "all executor threads busy with bench.long and one more run of it pending",
}

#: Transactions one pg_stat_database sample itself adds (its connection and its query).
SAMPLE_COST = 2


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=12.0, help="seconds before the window")
    parser.add_argument("--scenario", choices=SCENARIOS, default="none")
    parser.add_argument("--show-sql", action="store_true", help="print one statement per kind")
    return parser.parse_args()


def server_transactions() -> int | None:
    """Committed plus rolled-back transactions of the bench database (PostgreSQL only)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    import psycopg

    s = connection.settings_dict
    params = {"host": s["HOST"], "port": s["PORT"] or 5432, "user": s["USER"], "dbname": s["NAME"]}
    if s.get("PASSWORD"):
        params["password"] = s["PASSWORD"]
    with psycopg.connect(**params, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [s["NAME"]],
        ).fetchone()
    return int(row[0])


def due_instants(start: float, end: float, minutely: bool) -> list[float]:
    """The due times of the declared jobs inside [start, end) as epoch seconds."""
    if not minutely:
        return []
    first = int(start // 60 + 1) * 60
    return [float(t) for t in range(first, int(end) + 1, 60)]


def claims_between_due_times(entries: list, dues: list[float]) -> list:
    """Claiming statements not within 2 s after a due time (pending takes follow a won run)."""
    return [
        (at, kind)
        for at, kind, _ in entries
        if kind in CLAIMING and not any(0 <= at - due < 2.0 for due in dues)
    ]


def run_node(seconds: float, warmup: float) -> tuple[float, float, list[int | None]]:
    """Run an idle node for warmup + seconds; return the window and the server's counts."""
    from django_cluster_jobs.engine import Node

    samples: list[int | None] = []
    node = Node("idle-node")
    start = time.time()
    timers = [
        threading.Timer(warmup, lambda: samples.append(server_transactions())),
        threading.Timer(warmup + seconds, lambda: samples.append(server_transactions())),
    ]
    for timer in timers:
        timer.daemon = True
        timer.start()
    node.run(duration=warmup + seconds + 0.5)
    for timer in timers:
        timer.join(timeout=5)
    return start + warmup, start + warmup + seconds, samples


def report(log: counting.Log, window: tuple[float, float], samples: list, args) -> None:
    start, end = window
    entries = log.between(start, end)
    counts = log.counts(start, end)
    per_minute = 60.0 / args.seconds
    rows = [[kind, n, n * per_minute] for kind, n in counts.most_common()]
    statements = sum(n for kind, n in counts.items() if kind != counting.COMMIT)
    rows.append(["all statements (commits not included)", statements, statements * per_minute])
    if None not in samples and len(samples) == 2:
        xacts = samples[1] - samples[0] - SAMPLE_COST
        rows.append(["server transactions (pg_stat_database)", xacts, xacts * per_minute])
    print()
    common.table(["kind", f"in {args.seconds:g} s", "per minute"], rows)
    startup = log.counts(0, start)
    common.note(
        f"start-up and warm-up ({args.warmup:g} s) sent {sum(startup.values())} statements "
        "and commits, not counted above."
    )
    dues = due_instants(start, end, args.scenario == "minutely")
    stray = claims_between_due_times(entries, dues)
    when = ", ".join(datetime.fromtimestamp(d, UTC).strftime("%H:%M:%S") for d in dues) or "none"
    verdict = "NONE" if not stray else f"{len(stray)}"
    common.note(f"due times in the window: {when}; claiming statements between them: {verdict}")
    if stray:
        kinds = Counter(kind for _, kind in stray)
        common.note(f"  by kind: {dict(kinds)}; {len(stray) / args.seconds:.1f} per second")
    if args.show_sql:
        show_sql(entries)


def show_sql(entries: list) -> None:
    seen: dict[str, str] = {}
    for _, kind, sql in entries:
        seen.setdefault(kind, " ".join(sql.split())[:300])
    for kind, sql in sorted(seen.items()):
        print(f"  [{kind}] {sql}")


def saturate(seconds: float) -> None:
    """Enqueue one more long run than the node has threads; each lasts ``seconds``."""
    from django_cluster_jobs.conf import app_settings
    from django_cluster_jobs.services import enqueue

    os.environ["BENCH_LONG"] = f"{seconds:g}"  # read by the handler when it starts
    for _ in range(app_settings.EXECUTOR_THREADS + 1):
        enqueue("bench.long")


def main() -> None:
    args = arguments()
    common.setup(jobs="minutely" if args.scenario == "minutely" else "")
    if args.scenario == "saturated":
        saturate(args.warmup + args.seconds + 1.5)  # ends right after the node stops claiming
    log = counting.install()
    common.header(
        "idle.py",
        f"statements per minute of one node, default settings, {SCENARIOS[args.scenario]}, "
        f"{args.seconds:g} s window after {args.warmup:g} s warm-up",
    )
    window = run_node(args.seconds, args.warmup)
    report(log, window[:2], window[2], args)
    common.note(
        "counted through Django execute wrappers on every thread; not counted: the LISTEN "
        "connection (opened once with the driver) and BEGINs psycopg sends implicitly."
    )
    common.note(f"load at the end: {common.load()}")


if __name__ == "__main__":
    main()

"""Claim latency: one occurrence per call, and batches of 1 to 1000 occurrences in one call.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/benchdb python bench/claims.py

Runs the vendor's native path and the portable ORM path through ``ledger.vendor.claim`` on one
connection, and for comparison a raw ``INSERT … ON CONFLICT DO NOTHING`` into a scratch table.
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common  # noqa: E402

SCRATCH = "bench_scratch_claim"
BATCHES = (1, 10, 100, 1000)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--single", type=int, default=2000, help="single claims per path")
    parser.add_argument("--repeats", type=int, default=20, help="calls per batch size")
    parser.add_argument(
        "--budget", type=float, default=15.0, help="seconds at most per path and batch size"
    )
    parser.add_argument("--paths", default="native,orm", help="coordination paths to measure")
    return parser.parse_args()


def target_jobs(count: int) -> list[int]:
    """Create ``count`` enabled on-demand jobs like a declared one; return their ids.

    Jobs allow no overlap by default, so a claimed run holds its job's lane until it finishes:
    a batch of N due occurrences is N jobs due at one instant, as in a real tick.
    """
    from django_cluster_jobs.models import JobDefinition
    from django_cluster_jobs.services import definition_for

    model = definition_for("bench.noop")
    clones = []
    for i in range(count):
        clone = copy.copy(model)
        clone.pk, clone.name = None, f"bench.claim.{i}"
        clones.append(clone)
    JobDefinition.objects.bulk_create(clones)
    return list(
        JobDefinition.objects.filter(name__startswith="bench.claim.")
        .order_by("pk")
        .values_list("pk", flat=True)
    )


class Claimer:
    """Claims fresh occurrences of the target jobs through one coordinator, timing each call."""

    def __init__(self, kind: str, job_ids: list[int]) -> None:
        from django.utils import timezone

        from django_cluster_jobs.ledger import get_ledger

        self.kind = kind
        self.ledger = get_ledger(kind=None if kind == "native" else "orm")
        self.job_ids = job_ids
        self.now = timezone.now()
        self.lease_until = self.now + timedelta(seconds=30)
        self.serial = 0

    def claims(self, n: int) -> list:
        """One due occurrence of each of ``n`` jobs, under keys never claimed before."""
        from django_cluster_jobs.coordination import Claim

        self.serial += 1
        key = f"{self.kind}:{self.serial}"
        return [Claim(job_id, key, self.now) for job_id in self.job_ids[:n]]

    def timed(self, claims: list) -> tuple[float, int]:
        """Claim ``claims`` in one call; return the seconds it took and how many were won.

        The won runs are then finished (not timed), as the previous occurrence of a job would be.
        """
        from django_cluster_jobs.models import JobRun

        started = time.perf_counter()
        won = self.ledger.vendor.claim(claims, "bench", self.now, self.lease_until)
        seconds = time.perf_counter() - started
        if won:
            JobRun.objects.filter(state="running").update(state="succeeded", finished_at=self.now)
        return seconds, len(won)


def single(claimer: Claimer, n: int) -> tuple[list[float], list[float]]:
    """Time ``n`` one-occurrence claims that win, then as many that lose (key taken)."""
    for _ in range(50):  # warm up the connection and the plan cache
        claimer.timed(claimer.claims(1))
    won, lost, taken = [], [], []
    for _ in range(n):
        batch = claimer.claims(1)
        seconds, count = claimer.timed(batch)
        assert count == 1, "a fresh occurrence was not won"
        won.append(seconds)
        taken.append(batch)
    for batch in taken:
        seconds, count = claimer.timed(batch)
        assert count == 0, "a taken occurrence was won again"
        lost.append(seconds)
    return won, lost


def batches(claimer: Claimer, size: int, repeats: int, budget: float) -> list[float]:
    """Time up to ``repeats`` calls claiming ``size`` fresh occurrences, within ``budget`` s."""
    deadline = time.monotonic() + budget
    times = []
    while len(times) < repeats and (len(times) < 3 or time.monotonic() < deadline):
        seconds, count = claimer.timed(claimer.claims(size))
        assert count == size, f"won {count} of {size} fresh occurrences"
        times.append(seconds)
    return times


def raw_inserts(n: int) -> dict[str, list[float]]:
    """Time ``INSERT … ON CONFLICT DO NOTHING`` of one new key: Django cursor and driver cursor."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {SCRATCH}")
        cursor.execute(f"CREATE TABLE {SCRATCH} (k varchar(255) PRIMARY KEY)")
    query = f"INSERT INTO {SCRATCH} (k) VALUES (%s) ON CONFLICT DO NOTHING"
    driver_query = query if connection.vendor == "postgresql" else query.replace("%s", "?")
    times: dict[str, list[float]] = {"Django cursor": [], "driver cursor": []}
    with connection.cursor() as cursor:
        raw = connection.connection.cursor()
        for i in range(-50, n):
            started = time.perf_counter()
            cursor.execute(query, [f"d{i}"])
            middle = time.perf_counter()
            raw.execute(driver_query, [f"r{i}"])
            ended = time.perf_counter()
            if i >= 0:
                times["Django cursor"].append(middle - started)
                times["driver cursor"].append(ended - middle)
        raw.close()
        cursor.execute(f"DROP TABLE {SCRATCH}")
    return times


def breakdown(claimer: Claimer, size: int, repeats: int = 10) -> tuple[list, list[str]]:
    """PostgreSQL: where one claim call of ``size`` occurrences spends its time (medians, ms).

    The statement is captured from a real call (so this follows the package's SQL), then timed
    inside a transaction split at its deferred foreign-key checks and its commit; EXPLAIN ANALYZE
    of it (rolled back) gives the server's planning and execution.
    """
    from django.db import connection, transaction

    parts: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, seconds in split_call(claimer, size).items():
            parts.setdefault(name, []).append(seconds)
        sql, params = captured_claim(claimer, size)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON) " + sql, params)
            summary = dict(line[0].split(": ") for line in cursor.fetchall() if "Time:" in line[0])
            transaction.set_rollback(True)
        for key, name in (("Planning Time", "planning"), ("Execution Time", "execution")):
            parts.setdefault(name, []).append(float(summary[key][:-3]) / 1000)
    return [size, *(common.ms(common.pct(v, 0.5)) for v in parts.values())], list(parts)


def split_call(claimer: Claimer, size: int) -> dict[str, float]:
    """Time one claim's statement, deferred foreign-key checks and commit apart, in seconds."""
    from django.db import connection, transaction

    from django_cluster_jobs.models import JobRun

    claims = claimer.claims(size)
    started = time.perf_counter()
    with transaction.atomic():
        claimer.ledger.vendor.claim(claims, "bench", claimer.now, claimer.lease_until)
        statement = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        checks = time.perf_counter()
    committed = time.perf_counter()
    JobRun.objects.filter(state="running").update(state="succeeded", finished_at=claimer.now)
    return {
        "statement (+BEGIN)": statement - started,
        "FK checks": checks - statement,
        "commit": committed - checks,
    }


def captured_claim(claimer: Claimer, size: int) -> tuple[str, list]:
    """The (last) statement a claim of ``size`` occurrences sends, from a rolled-back call."""
    from django.db import connection, transaction

    sent = []

    def capture(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture), transaction.atomic():
        claimer.ledger.vendor.claim(claimer.claims(size), "bench", claimer.now, claimer.lease_until)
        transaction.set_rollback(True)
    return sent[-1]


def row(label: str, times: list[float], size: int = 1) -> list:
    samples = [common.ms(t) for t in times]
    p50 = common.pct(samples, 0.5)
    return [label, len(samples), p50, common.pct(samples, 0.99), max(samples), p50 / size]


def main() -> None:
    args = arguments()
    common.setup()
    from django.db import connection

    common.header("claims.py", "claim latency through ledger.vendor.claim on one connection")
    job_ids = target_jobs(max(BATCHES))
    rows = [row(f"raw INSERT … ON CONFLICT, {k}", v) for k, v in raw_inserts(args.single).items()]
    for kind in args.paths.split(","):
        claimer = Claimer(kind, job_ids)
        gc.collect()
        won, lost = single(claimer, args.single)
        rows.append(row(f"{kind}: 1 occurrence, won", won))
        rows.append(row(f"{kind}: 1 occurrence, lost (key taken)", lost))
        for size in BATCHES:
            gc.collect()
            times = batches(claimer, size, args.repeats, args.budget)
            rows.append(row(f"{kind}: batch of {size} in one call", times, size))
    print()
    common.table(
        ["what (one call each)", "calls", "p50 ms", "p99 ms", "max ms", "p50 ms/occ"], rows
    )
    common.note(
        f"{args.single} single claims per path after 50 warm-up claims; each batch size "
        f"repeated up to {args.repeats} times (fewer if over {args.budget:g} s, at least 3); a "
        "batch of N is one due occurrence of each of N enabled jobs; the p99 of fewer than 100 "
        "calls is their maximum; each call commits on its own."
    )
    if connection.vendor == "postgresql" and "native" in args.paths.split(","):
        print_breakdown(Claimer("native", job_ids))
    common.note(f"load at the end: {common.load()}")


def print_breakdown(claimer: Claimer) -> None:
    rows = []
    for size in (1, 1000):
        values, names = breakdown(claimer, size)
        rows.append(values)
    print()
    common.table(["native claim, occurrences", *(f"{n} ms" for n in names)], rows)
    common.note(
        "medians of 10 calls: the statement (with psycopg's implicit BEGIN), the deferred "
        "foreign-key checks (SET CONSTRAINTS ALL IMMEDIATE) and the commit timed apart inside one "
        "transaction; planning and execution on the server from EXPLAIN ANALYZE (rolled back), "
        "part of the statement's time."
    )


if __name__ == "__main__":
    main()

"""The admin and the API on a large ledger: fill PostgreSQL with millions of runs, time the pages.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bigledger python bench/big_ledger.py

Fills the ledger with set-based SQL (``INSERT … SELECT FROM generate_series``, in batches): jobs
of which a few are very busy and most are not, runs over the last 30 days in every state, on a
dozen nodes and several queues, each with its timeline events. Then times, through Django's test
client as a logged-in superuser, the runs changelist (default, filtered, searched), a job's page,
a run's page, the overview and the API's lists: median and max of several requests each, with
the number of statements and the slowest one. ``--skip-fill`` times an already filled ledger.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common  # noqa: E402

NODES = 12
QUEUES = ("default", "default", "default", "reports", "mail", "billing", "etl", "imports")
DAYS = 30
#: Runs of one state, by the cumulative share of a random draw (jobs other than the busiest).
STATES = (
    (0.880, "succeeded"), (0.920, "failed"), (0.950, "skipped"), (0.960, "cancelled"),
    (0.975, "missed"), (0.980, "timed_out"), (0.990, "dead"), (0.995, "lost"),
    (1.001, "succeeded"),
)  # fmt: skip
#: The event that ends a run's timeline, by its state.
END_EVENT = {"succeeded": "succeeded", "failed": "failed", "skipped": "skipped",
             "cancelled": "cancelled", "missed": "missed", "timed_out": "timed_out",
             "dead": "dead", "lost": "lost"}  # fmt: skip
FAILED = ("failed", "timed_out", "dead", "lost")

# One batch of runs: job index drawn as floor(jobs * r^3), so the first few jobs get most of the
# rows (the busiest about 15 %) and the last ones a thousandth each; the busiest job only ever
# succeeds or skips, as a per-second health check does. Times spread evenly over DAYS.
RUNS_SQL = """
INSERT INTO {runs} (job_id, key, scheduled_at, due_at, state, outcome, attempt, node, fence,
    priority, payload, task_path, args, kwargs, error, traceback, reason, cause,
    cancel_requested, created_at, started_at, finished_at)
SELECT j.ids[1 + d.job], 'b' || d.g, d.at, d.at, d.state,
    CASE WHEN d.state = 'missed' THEN 'missed' WHEN d.g %% 10 = 0 THEN 'enqueued' ELSE 'won' END,
    1, 'node-' || lpad((d.g %% {nodes})::text, 2, '0'), 1, 0, '{{}}', '', '[]', '{{}}',
    CASE WHEN d.state IN {failed} THEN 'RuntimeError: upstream answered 503' ELSE '' END,
    '', '', '', false, d.at, d.at + interval '20 ms', d.at + (d.r * interval '3 s')
FROM (
    SELECT g, p.job, p.at, p.r,
           CASE WHEN p.job = 0 THEN CASE WHEN p.r < 0.99 THEN 'succeeded' ELSE 'skipped' END
                ELSE {state_case} END AS state
    FROM (
        SELECT g, floor(%(jobs)s * power(random(), 3))::int AS job, random() AS r,
               now() - random() * interval '{days} days' AS at
        FROM generate_series(%(lo)s, %(hi)s) AS g
    ) AS p
) AS d, (SELECT %(ids)s::bigint[] AS ids) AS j
"""
EVENTS_SQL = """
INSERT INTO {events} (run_id, at, kind, node, fence, reason)
SELECT id, scheduled_at, 'claimed', node, 1, '' FROM {runs} WHERE id BETWEEN %(lo)s AND %(hi)s
UNION ALL
SELECT id, coalesce(finished_at, scheduled_at), {end_case}, node, 1, ''
FROM {runs} WHERE id BETWEEN %(lo)s AND %(hi)s
"""


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="runs in the ledger")
    parser.add_argument("--jobs", type=int, default=300, help="jobs that have runs")
    parser.add_argument("--idle-jobs", type=int, default=20, help="jobs with no run at all")
    parser.add_argument("--batch", type=int, default=250_000, help="rows per INSERT")
    parser.add_argument("--repeats", type=int, default=7, help="timed requests per page")
    parser.add_argument("--skip-fill", action="store_true", help="time the ledger as it is")
    return parser.parse_args()


def setup() -> None:
    import os

    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings_admin"
    os.environ["BENCH_JOBS"] = ""
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def tables() -> dict[str, str]:
    from django.db import connection

    from django_cluster_jobs.models import JobRun, RunEvent

    quote = connection.ops.quote_name
    return {"runs": quote(JobRun._meta.db_table), "events": quote(RunEvent._meta.db_table)}


def cases() -> tuple[str, str]:
    states = " ".join(f"WHEN p.r < {share} THEN '{state}'" for share, state in STATES)
    ends = " ".join(f"WHEN state = '{state}' THEN '{kind}'" for state, kind in END_EVENT.items())
    return f"CASE {states} END", f"CASE {ends} ELSE 'succeeded' END"


def make_jobs(busy: int, idle: int) -> list[int]:
    """Create the jobs (a few queues, the busiest first); return the ids of those with runs."""
    from datetime import timedelta

    from django.utils import timezone

    from django_cluster_jobs.models import JobDefinition

    since = timezone.now() - timedelta(days=DAYS + 1)
    rows = [
        JobDefinition(
            name=f"bench.big.job-{i:03d}", callable_name="bench.noop", source="code",
            schedule_kind="cron", cron=f"{i % 60} * * * *", queue=QUEUES[i % len(QUEUES)],
            settled_through=since,
        )
        for i in range(busy + idle)
    ]  # fmt: skip
    JobDefinition.objects.bulk_create(rows)
    ids = JobDefinition.objects.order_by("name").values_list("pk", flat=True)
    return list(ids)[:busy]


def make_cluster() -> None:
    """Nodes heartbeating now, a leader, live runs and a few thousand cluster events."""
    from datetime import timedelta

    from django.utils import timezone

    from django_cluster_jobs.models import ClusterEvent, Lease, WorkerNode

    now = timezone.now()
    WorkerNode.objects.bulk_create(
        WorkerNode(node_id=f"node-{i:02d}", host=f"pod-{i}", status="active",
                   started_at=now - timedelta(days=2), last_heartbeat=now)
        for i in range(NODES)
    )  # fmt: skip
    Lease.objects.create(
        name="leader", holder="node-00", token="t", fence=7, acquired_at=now,
        expires_at=now + timedelta(hours=1),
    )  # fmt: skip
    ClusterEvent.objects.bulk_create(
        ClusterEvent(at=now - timedelta(minutes=10 * i), kind="reaped", node="node-00",
                     detail="reaped 1 expired lease")
        for i in range(DAYS * 144)
    )  # fmt: skip


def live_runs(ids: list[int]) -> None:
    """Pending runs due over the last minutes (a backlog) and running ones, as in a live cluster."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {tables()['runs']} (job_id, key, scheduled_at, due_at, state, outcome,
                attempt, node, fence, priority, payload, task_path, args, kwargs, error,
                traceback, reason, cause, cancel_requested, created_at, pending_rank,
                lease_expires_at, started_at)
            SELECT ids[1 + g %% array_length(ids, 1)], 'live-' || g, t, t,
                CASE WHEN g <= 40 THEN 'running' ELSE 'pending' END, 'enqueued', 1,
                CASE WHEN g <= 40 THEN 'node-' || lpad((g %% {NODES})::text, 2, '0') ELSE '' END,
                1, 0, '{{}}', '', '[]', '{{}}', '', '', '', '', false, t,
                (extract(epoch FROM t) * 1000000)::bigint,
                CASE WHEN g <= 40 THEN now() + interval '15 s' END,
                CASE WHEN g <= 40 THEN t END
            FROM generate_series(1, 500) AS g, LATERAL (SELECT %s::bigint[] AS ids) AS j,
                LATERAL (SELECT now() - g * interval '1 s' AS t) AS p
            """,
            [ids[1:]],
        )


def fill(args: argparse.Namespace) -> None:
    from django.db import connection, transaction

    common.wipe()
    ids = make_jobs(args.jobs, args.idle_jobs)
    make_cluster()
    names, (state_case, end_case) = tables(), cases()
    runs_sql = RUNS_SQL.format(
        **names, nodes=NODES, days=DAYS, failed=str(FAILED), state_case=state_case
    )
    started = time.monotonic()
    for lo in range(1, args.rows + 1, args.batch):
        hi = min(args.rows, lo + args.batch - 1)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
            cursor.execute(runs_sql, {"lo": lo, "hi": hi, "ids": ids, "jobs": args.jobs})
        print(f"runs {hi:>10,} ({time.monotonic() - started:.0f} s)", flush=True)
    live_runs(ids)
    events_sql = EVENTS_SQL.format(**names, end_case=end_case)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT min(id), max(id) FROM {names['runs']}")
        first, last = cursor.fetchone()
    for lo in range(first, last + 1, args.batch):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
            cursor.execute(events_sql, {"lo": lo, "hi": lo + args.batch - 1})
        print(f"events up to run {min(last, lo + args.batch - 1):>10,} "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {names['runs']}")
        cursor.execute(f"VACUUM ANALYZE {names['events']}")
    print(f"filled in {time.monotonic() - started:.0f} s", flush=True)


def pages() -> list[tuple[str, str]]:
    """(label, path) of every page timed, with jobs picked by how busy they are."""
    from django.db.models import Count

    from django_cluster_jobs.models import JobDefinition, JobRun

    jobs = list(JobDefinition.objects.order_by("name"))
    counts = dict(
        JobRun.objects.filter(job__in=[jobs[0], jobs[40], jobs[-1]])
        .values_list("job").annotate(n=Count("pk")).order_by()
    )  # fmt: skip
    busy, middling, idle = jobs[0], jobs[40], jobs[-1]
    run = JobRun.objects.filter(job=middling, state="failed").order_by("-pk").first()
    runs = "/admin/cluster_jobs/jobrun/"

    def runs_of(job: JobDefinition) -> str:
        return f"{job.name} ({counts.get(job.pk, 0):,} runs)"

    return [
        ("runs: default", runs),
        (f"runs: job {runs_of(busy)}", f"{runs}?job={busy.pk}"),
        (f"runs: job {runs_of(middling)}", f"{runs}?job={middling.pk}"),
        (f"runs: job {runs_of(idle)}", f"{runs}?job={idle.pk}"),
        ("runs: state succeeded", f"{runs}?state__exact=succeeded"),
        ("runs: state failed", f"{runs}?state__exact=failed"),
        ("runs: state lost", f"{runs}?state__exact=lost"),
        ("runs: state dead", f"{runs}?state__exact=dead"),
        ("runs: state pending", f"{runs}?state__exact=pending"),
        ("runs: queue reports", f"{runs}?queue=reports"),
        ("runs: node node-03", f"{runs}?node=node-03"),
        ("runs: last 24 hours", f"{runs}?scheduled=day"),
        (f"runs: search {middling.name}", f"{runs}?q={middling.name}"),
        ("runs: search a key", f"{runs}?q={run.key if run else 'b1'}"),
        ("runs: job + state failed", f"{runs}?job={middling.pk}&state__exact=failed"),
        ("runs: page 50", f"{runs}?p=50"),
        (f"job page {runs_of(busy)}", f"/admin/cluster_jobs/jobdefinition/{busy.pk}/change/"),
        (f"job page {runs_of(middling)}",
         f"/admin/cluster_jobs/jobdefinition/{middling.pk}/change/"),
        ("jobs changelist", "/admin/cluster_jobs/jobdefinition/"),
        ("run page", f"{runs}{run.pk}/change/" if run else runs),
        ("overview", "/admin/cluster_jobs/workernode/overview/"),
        ("nodes changelist", "/admin/cluster_jobs/workernode/"),
        ("run events changelist", "/admin/cluster_jobs/runevent/"),
        ("api: runs", "/api/runs/"),
        (f"api: runs of {busy.name}", f"/api/runs/?job={busy.name}"),
        (f"api: runs of {middling.name}", f"/api/runs/?job={middling.name}"),
        (f"api: runs of {idle.name}", f"/api/runs/?job={idle.name}"),
        ("api: runs failed", "/api/runs/?state=failed"),
        ("api: runs lost", "/api/runs/?state=lost"),
        ("api: run", f"/api/runs/{run.pk}/" if run else "/api/runs/"),
        ("api: jobs", "/api/jobs/"),
        (f"api: job {middling.name}", f"/api/jobs/{middling.name}/"),
        ("api: nodes", "/api/nodes/"),
        ("api: status", "/api/status/"),
    ]


def timed(client: Any, path: str, repeats: int) -> tuple[list[float], int, float]:
    """Times of ``repeats`` requests (after one untimed), statements and slowest statement (ms)."""
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    reset_queries()
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    if response.status_code != 200:
        raise SystemExit(f"{path} answered {response.status_code}")
    sent = captured.captured_queries  # before the next request resets the log
    slowest = max((float(q["time"]) for q in sent), default=0.0)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        client.get(path)
        times.append(common.ms(time.perf_counter() - started))
    return times, len(sent), slowest * 1000


def measure(args: argparse.Namespace) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from django_cluster_jobs.models import JobRun, RunEvent

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    common.note(
        f"ledger: {JobRun.objects.order_by().count():,} runs, "
        f"{RunEvent.objects.order_by().count():,} run events"
    )
    rows = []
    for label, path in pages():
        times, statements, slowest = timed(client, path, args.repeats)
        rows.append((label, statistics.median(times), max(times), statements, slowest))
        print(f"  {label}: {rows[-1][1]:.0f} ms", flush=True)
    common.table(("page", "median ms", "max ms", "statements", "slowest statement ms"), rows)
    over = [row[0] for row in rows if row[2] >= 500]
    common.note(f"over 500 ms at least once: {', '.join(over) if over else 'none'}")


def main() -> None:
    args = arguments()
    setup()
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("bench/big_ledger.py fills the ledger with PostgreSQL's generate_series")
    common.header("big_ledger.py", "the admin and the API on a large ledger")
    if not args.skip_fill:
        fill(args)
    measure(args)
    common.header("big_ledger.py", "(end)")


if __name__ == "__main__":
    main()

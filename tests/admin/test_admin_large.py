"""The admin on a large ledger: no page counts the whole ledger, and indexes serve the lists.

Timings live in bench/big_ledger.py; these pin what keeps them: the statements the pages send
and, on PostgreSQL, the plans of the queries behind them.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_cluster_jobs.admin.paging import LedgerPaginator
from django_cluster_jobs.models import JobRun, RunState
from django_cluster_jobs.overview import cluster_overview
from tests.admin.pages import url
from tests.factories import JobDefinitionFactory, JobRunFactory

pytestmark = pytest.mark.django_db

RUN_LISTS = (
    "", "?state__exact=failed", "?queue=reports", "?node=node-a", "?scheduled=day", "?q=busy",
    "?q=2026-01-01T00:00:01.001Z", "?outcome__exact=won",
)  # fmt: skip
COUNT = re.compile(r"\bCOUNT\(", re.IGNORECASE)


def statements(client, path: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200
    return [query["sql"] for query in queries.captured_queries]


@pytest.fixture
def runs(db):
    busy = JobDefinitionFactory(name="busy", queue="reports")
    JobRunFactory.create_batch(5, job=busy, node="node-a")
    JobRunFactory(job=busy, state=RunState.FAILED, node="node-a")
    return busy


@pytest.mark.parametrize("query", RUN_LISTS)
def test_the_runs_list_counts_at_most_a_bounded_number_of_rows(admin_client, runs, query):
    sent = statements(admin_client, url("jobrun") + query)
    counts = [sql for sql in sent if COUNT.search(sql) and "cluster_jobs_jobrun" in sql]
    assert counts, "the list says how many runs match"
    for sql in counts:
        assert f"LIMIT {LedgerPaginator.cap + 1}" in sql, sql


@pytest.mark.parametrize("query", ["", "?job={job}"])
def test_a_job_filter_and_the_default_list_use_no_join_to_count(admin_client, runs, query):
    sent = statements(admin_client, url("jobrun") + query.format(job=runs.pk))
    assert not any(COUNT.search(sql) and "JOIN" in sql for sql in sent)


def test_a_list_longer_than_the_cap_says_more_than(admin_client, runs, monkeypatch):
    monkeypatch.setattr(LedgerPaginator, "cap", 3)
    response = admin_client.get(url("jobrun") + f"?job={runs.pk}")
    assert response.context["cl"].result_count == 3
    assert "more than 3 runs" in response.content.decode()


def test_a_short_list_says_its_exact_count(admin_client, runs):
    page = admin_client.get(url("jobrun") + "?state__exact=failed").content.decode()
    assert re.search(r"\b1 run\b", page) and "more than" not in page and "about" not in page


def test_the_search_matches_job_names_keys_and_nodes(admin_client, runs):
    other = JobRunFactory(key="the-key", node="node-z")
    found = {
        term: {run.pk for run in admin_client.get(url("jobrun") + f"?q={term}").context["cl"]
               .result_list}
        for term in ("us", "the-key", "node-z", "the-ke")
    }  # fmt: skip
    assert found["us"] == set(JobRun.objects.filter(job=runs).values_list("pk", flat=True))
    assert found["the-key"] == found["node-z"] == {other.pk}
    assert found["the-ke"] == set(), "keys are matched whole, on the claim's unique index"


def test_the_scheduled_filter_keeps_recent_runs(admin_client, runs):
    old = JobRunFactory(job=runs, scheduled_at=timezone.now() - timedelta(days=3))
    listed = admin_client.get(url("jobrun") + "?scheduled=day").context["cl"].result_list
    week = admin_client.get(url("jobrun") + "?scheduled=week").context["cl"].result_list
    assert old not in list(listed) and old in list(week)


# -- plans (PostgreSQL) -------------------------------------------------------------------------


def plan(queryset) -> str:
    """The plan of ``queryset`` with sequential scans and sorts priced out: the index it names
    is one that serves the query on a ledger of any size."""
    with connection.cursor() as cursor:
        for setting in ("enable_seqscan", "enable_sort", "enable_bitmapscan"):
            cursor.execute(f"SET LOCAL {setting} = off")
    return queryset.explain()


@pytest.mark.postgresql
@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("newest", "cluster_jobs_run_recent"),
        ("of_job", "cluster_jobs_run_job_recent"),
        ("of_job_by_id", "cluster_jobs_run_job_id"),
        ("failed_state", "cluster_jobs_run_failed_recent"),
        ("last_run", "cluster_jobs_run_job_recent"),
        ("last_failure", "cluster_jobs_run_job_failed"),
        ("recent_failures", "cluster_jobs_run_failed"),
        ("dead_letters", "cluster_jobs_run_dead"),
        ("last_day", "cluster_jobs_run_recent"),
    ],
)
def test_the_lists_are_served_by_an_index(runs, name, index):
    now = timezone.now()
    ledger = JobRun.objects.all()
    queries = {
        "newest": ledger.order_by("-scheduled_at", "-id")[:100],
        "of_job": ledger.filter(job=runs).order_by("-scheduled_at", "-id")[:100],
        "of_job_by_id": ledger.filter(job=runs).order_by("-id")[:51],
        "failed_state": ledger.filter(state=RunState.LOST).order_by("-scheduled_at", "-id")[:100],
        "last_run": ledger.filter(job=runs).scheduled_by(now).newest_first()[:1],
        "last_failure": ledger.filter(job=runs).failures().newest_first()[:1],
        "recent_failures": ledger.failures().filter(finished_at__isnull=False)
        .order_by("-finished_at", "-pk")[:10],
        "dead_letters": ledger.filter(state=RunState.DEAD).order_by().values("job")
        .annotate(n=Count("pk")),
        "last_day": ledger.filter(scheduled_at__gte=now - timedelta(days=1))
        .values_list("job_id", "state"),
    }  # fmt: skip
    assert index in plan(queries[name])


@pytest.mark.postgresql
def test_an_unfiltered_list_shows_the_estimate_and_counts_nothing(admin_client, runs):
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {JobRun._meta.db_table}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LedgerPaginator, "cap", 2)
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(url("jobrun")).content.decode()
    sent = [query["sql"] for query in queries.captured_queries]
    assert not [sql for sql in sent if COUNT.search(sql) and "cluster_jobs_jobrun" in sql]
    assert any("reltuples" in sql for sql in sent)
    assert "the database&#x27;s estimate" in page or "the database's estimate" in page


def test_the_overview_reads_the_last_day_without_a_join(runs):
    with CaptureQueriesContext(connection) as queries:
        report = cluster_overview(connection.alias)
    truncs = ("date_trunc", "django_datetime_trunc", "date_format")  # PostgreSQL, SQLite, MySQL
    day = [q["sql"] for q in queries.captured_queries
           if any(trunc in q["sql"].lower() for trunc in truncs)]  # fmt: skip
    assert day and all("JOIN" not in sql for sql in day)
    busy = next(job for job in report["jobs"] if job["name"] == "busy")
    assert sum(sum(cell.counts.values()) for cell in busy["strip"]) == 6


def test_the_current_hour_counts_a_run_scheduled_in_the_reports_last_millisecond(runs):
    """The report writes its time to the millisecond; the strips must use the instant itself."""
    run = JobRunFactory(job=runs, node="node-a")
    at = run.scheduled_at.replace(microsecond=run.scheduled_at.microsecond // 1000 * 1000 + 999)
    JobRun.objects.filter(pk=run.pk).update(scheduled_at=at)
    report = cluster_overview(connection.alias, now=at)
    busy = next(job for job in report["jobs"] if job["name"] == "busy")
    assert sum(sum(cell.counts.values()) for cell in busy["strip"]) == 7

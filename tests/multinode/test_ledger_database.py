"""The ledger on a database of its own: two real nodes, the application's tables on another.

The application's database (``default``) and the ledger's (``ledger``, CLUSTER_JOBS["DATABASE"])
are two fresh databases of the test's own (two PostgreSQL databases, or two SQLite files), set up
by ``tests/settings_ledger.py`` with :class:`~django_cluster_jobs.routers.LedgerRouter`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import ROOT, database_url, wait_until
from tests.timing import FEW_SECONDS_OF_RUNS, NODE_EXIT, PROCESS_LIFE, REACT, scaled

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

SETTINGS = "tests.settings_ledger"
#: A node the test stops itself (SIGTERM) serves at most this long: longer than the test's
#: waits on a healthy cluster, and within PROCESS_LIFE with its start and its exit.
SERVES = scaled(60)

# Run in a process on the split settings: trigger tests.manual through the API, then read the
# runs back through the API and the admin, as a logged-in superuser of the default database.
CLIENT = """
import json
import django
django.setup()
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()  # so the admin's response carries its context
user = User.objects.create_superuser("ops", "ops@example.com", "x")
client = Client()
client.force_login(user)
made = client.post("/api/jobs/tests.manual/trigger/", {}, content_type="application/json")
api = client.get("/api/runs/?job=tests.every_second&page_size=500").json()["results"]
admin = client.get("/admin/cluster_jobs/jobrun/?q=tests.every_second")
print(json.dumps({"made": made.status_code, "run": made.json().get("id"),
                  "api": sorted(run["key"] for run in api),
                  "admin": sorted(run.key for run in admin.context["cl"].result_list)}))
"""


@dataclass
class Split:
    """The two databases: URLs for the processes, and a way to query each from the test."""

    app: str
    ledger: str

    def env(self) -> dict[str, str]:
        return {"DJANGO_SETTINGS_MODULE": SETTINGS, "DATABASE_URL": self.app,
                "LEDGER_DATABASE_URL": self.ledger}  # fmt: skip

    def manage(self, *args: str, code: str | None = None) -> str:
        cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "django", *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env()}
        done = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=PROCESS_LIFE
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def rows(self, url: str, sql: str) -> list[tuple]:
        if url.startswith("sqlite:///"):
            with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
                return db.execute(sql).fetchall()
        import psycopg

        with psycopg.connect(url.replace("postgres://", "postgresql://")) as db:
            return db.execute(sql).fetchall()

    def tables(self, url: str) -> set[str]:
        if url.startswith("sqlite:///"):
            return {row[0] for row in self.rows(url, "SELECT name FROM sqlite_master")}
        query = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        return {row[0] for row in self.rows(url, query)}


@pytest.fixture
def split(tmp_path: Path) -> Iterator[Split]:
    """Two empty databases, migrated as the how-to says: ``migrate``, ``migrate --database``."""
    if connection.vendor not in ("sqlite", "postgresql"):
        pytest.skip(f"the fixture makes its two databases on SQLite or PostgreSQL only, not on "
                    f"{connection.vendor}")  # fmt: skip
    base = database_url()
    if connection.vendor == "sqlite":
        app, ledger = tmp_path / "app.sqlite3", tmp_path / "ledger.sqlite3"
        made = Split(f"sqlite:///{app}", f"sqlite:///{ledger}")
        names: list[str] = []
    else:
        server, test_name = base.rsplit("/", 1)
        names = [f"{test_name}_app", f"{test_name}_ledger"]
        with connection.cursor() as cursor:
            for name in names:
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                cursor.execute(f'CREATE DATABASE "{name}"')
        made = Split(f"{server}/{names[0]}", f"{server}/{names[1]}")
    made.manage("migrate", "--verbosity", "0")
    made.manage("migrate", "--database", "ledger", "--verbosity", "0")
    yield made
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_two_nodes_run_each_occurrence_once_with_the_ledger_on_its_own_database(
    split, start_scheduler
):
    nodes = [
        start_scheduler(
            f"split-{i}", "--duration", f"{SERVES:g}", jobs="every_second", **split.env()
        )
        for i in range(2)
    ]
    every = "SELECT key FROM tests_effect WHERE job = 'tests.every_second'"
    wait_until(lambda: len(split.rows(split.app, every)) >= 3, timeout=FEW_SECONDS_OF_RUNS)
    seen = json.loads(split.manage(code=CLIENT).strip().splitlines()[-1])
    manual = "SELECT node FROM tests_effect WHERE job = 'tests.manual'"
    wait_until(lambda: split.rows(split.app, manual), timeout=REACT)
    # Let the per-second job run a few more occurrences before the nodes stop.
    wait_until(lambda: len(split.rows(split.app, every)) >= 6, timeout=FEW_SECONDS_OF_RUNS)
    for node in nodes:
        node.signal(signal.SIGTERM)
    for node in nodes:
        assert node.wait(timeout=NODE_EXIT) == 0, node.output()

    runs = split.rows(split.ledger, (
        "SELECT r.key, r.state, r.node FROM cluster_jobs_jobrun r JOIN cluster_jobs_jobdefinition j"
        " ON j.id = r.job_id WHERE j.name = 'tests.every_second'"
    ))  # fmt: skip
    effects = sorted(key for (key,) in split.rows(split.app, every))
    assert len(effects) >= 6 and len(effects) == len(set(effects)), "an occurrence ran twice"
    succeeded = sorted(key for key, state, _node in runs if state == "succeeded")
    assert succeeded == effects, runs
    assert len({key for key, _state, _node in runs}) == len(runs)
    assert len(split.rows(split.app, manual)) == 1
    nodes_seen = split.rows(split.ledger, "SELECT node_id, status FROM cluster_jobs_workernode")
    assert sorted(nodes_seen) == [("split-0", "stopped"), ("split-1", "stopped")]

    # The API and the admin read the ledger's database, and the API's trigger wrote there.
    assert seen["made"] == 201 and seen["api"]
    assert set(seen["api"]) <= set(seen["admin"]) <= {key for key, _state, _node in runs}
    ledger_runs = {row[0] for row in split.rows(split.ledger, "SELECT id FROM cluster_jobs_jobrun")}
    assert seen["run"] in ledger_runs

    # Nothing of ours in the application's database; its own tables are there.
    assert not {t for t in split.tables(split.app) if t.startswith("cluster_jobs_")}
    assert {"tests_effect", "auth_user"} <= split.tables(split.app)

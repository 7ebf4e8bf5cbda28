"""Settings of the benchmarks: DATABASE_URL picks the database (default an SQLite file under /tmp).

CLUSTER_JOBS is left at the library's documented defaults (heartbeat 5 s, lease 30 s, leader
lease 15 s, dead after 60 s, 4 executor threads, poll interval 1 s) so the figures describe what
a production deployment gets; only COORDINATION may be forced by BENCH_COORDINATION.
"""

from pathlib import Path

import environ

env = environ.Env()

DEFAULT_DATABASE_URL = "sqlite:////tmp/bench/bench.sqlite3"

SECRET_KEY = "bench-only-not-secret"
DEBUG = False  # DEBUG=True would keep every query in memory and slow the hot paths down
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_cluster_jobs",
    "bench.apps.BenchConfig",
]

DATABASES = {"default": env.db("DATABASE_URL", default=DEFAULT_DATABASE_URL)}
_db = DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    Path(_db["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # What the quickstart recommends for SQLite: WAL, a busy timeout, write lock up front.
    _db["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }

# django.tasks (bench/tasks_drain.py): built into Django 6.0+, from the backport (an app) on 5.2.
try:
    import django.tasks  # noqa: F401
except ImportError:
    try:
        import django_tasks  # noqa: F401
    except ImportError:  # neither installed: bench/tasks_drain.py cannot run, the others can
        pass
    else:
        INSTALLED_APPS.insert(-2, "django_tasks")
TASKS = {"default": {"BACKEND": "django_cluster_jobs.tasks.ClusterJobsBackend"}}

CLUSTER_JOBS = {"COORDINATION": env.str("BENCH_COORDINATION", default="auto")}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_cluster_jobs": {"handlers": ["console"], "level": "WARNING"}},
}

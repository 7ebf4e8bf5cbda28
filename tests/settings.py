"""Settings of the test suite: the database comes from DATABASE_URL (default: an SQLite file)."""

import sys
from pathlib import Path

import environ

from tests.timing import scaled

BASE_DIR = Path(__file__).resolve().parent
env = environ.Env()

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the live server of the browser tests serves the admin's JS
    "rest_framework",
    "drf_spectacular",  # for manage.py spectacular; the API's schema view needs no app
    "django_cluster_jobs",
    "tests",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# The pytest run creates test_<name>; scheduler subprocesses started by the tests get the
# test database's own URL in DATABASE_URL and CLUSTER_JOBS_TEST_CHILD=1, so they use it as is.
# The SQLite file is named by the Python version, so suites of two versions can run at once.
_SQLITE = BASE_DIR / f"tests-py{sys.version_info[0]}{sys.version_info[1]}.sqlite3"
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{_SQLITE}")}
_db = DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    _db["OPTIONS"] = {
        "timeout": scaled(20),  # SQLite's busy timeout: a writer waits this long for the lock
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }
    _name = Path(_db["NAME"])
    _db["TEST"] = {"NAME": str(_name.with_name(f"test_{_name.name}"))}
elif _db["ENGINE"].endswith("mysql"):  # MariaDB / MySQL
    from tests.mysql import use_pymysql

    use_pymysql()
    _db["OPTIONS"] = {"charset": "utf8mb4"}
    _db["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}

# The scheduler's timings, in seconds of a reference machine: each one (and each override a test
# gives a scheduler process through its environment) times the suite's one scale (tests/timing.py).
CLUSTER_JOBS = {
    "HEARTBEAT_INTERVAL": scaled(env.float("CLUSTER_JOBS_HEARTBEAT", default=0.5)),
    "LEASE_TTL": scaled(env.float("CLUSTER_JOBS_LEASE_TTL", default=3.0)),
    "GRACE_PERIOD": scaled(env.float("CLUSTER_JOBS_GRACE", default=5.0)),
    "LEADER_TTL": scaled(env.float("CLUSTER_JOBS_LEADER_TTL", default=2.0)),
    "DEAD_AFTER": scaled(env.float("CLUSTER_JOBS_DEAD_AFTER", default=4.0)),
    "COORDINATION": env.str("CLUSTER_JOBS_COORDINATION", default="auto"),
    "PRESENCE": env.bool("CLUSTER_JOBS_TEST_PRESENCE", default=True),
    "EXECUTOR_THREADS": 4,
    "POLL_INTERVAL": scaled(env.float("CLUSTER_JOBS_TEST_POLL", default=1.0)),
    "CLOCK": env.str("CLUSTER_JOBS_TEST_CLOCK", default="tests.clocks.EnvSkewedClock"),
    "QUEUE_LIMITS": {"limited": 2},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_cluster_jobs": {"handlers": ["console"], "level": "WARNING"}},
}

# django.tasks: built into Django 6.0+, from the django-tasks backport (an app) on 5.2.
try:
    import django.tasks  # noqa: F401
except ImportError:
    try:
        import django_tasks  # noqa: F401
    except ImportError:  # neither: the checks test that cluster_jobs.E020 says so
        pass
    else:
        INSTALLED_APPS.insert(-2, "django_tasks")
TASKS = {
    "default": {
        "BACKEND": "django_cluster_jobs.tasks.ClusterJobsBackend",
        "QUEUES": ["default", "other"],
    },
    "at_most_once": {
        "BACKEND": "django_cluster_jobs.tasks.ClusterJobsBackend",
        "OPTIONS": {"DELIVERY": "at_most_once"},
    },
}
if _spans := env.str("CLUSTER_JOBS_TEST_SPANS", default=""):
    from tests.spans import export_to

    export_to(_spans)

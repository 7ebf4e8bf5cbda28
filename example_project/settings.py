"""Settings of the example project, read from the environment (django-environ).

DATABASE_URL picks the database (default: an SQLite file beside this module); DEBUG and SECRET_KEY
have development defaults. This project is a demo: do not deploy it as it is.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent
env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-example-project-only")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_cluster_jobs",
    "example_project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several scheduler processes share the file: WAL lets readers run beside the one writer,
    # BEGIN IMMEDIATE takes the write lock up front, and the timeout waits for it.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True
STATIC_URL = "static/"

CLUSTER_JOBS = {
    "EXECUTOR_THREADS": env.int("CLUSTER_JOBS_EXECUTOR_THREADS", default=4),
    "GRACE_PERIOD": env.float("CLUSTER_JOBS_GRACE_PERIOD", default=10.0),
}

# No handler is configured for django_cluster_jobs, so runscheduler adds its own: the library's log
# lines (and the jobs' ctx.logger lines) go to stderr, prefixed with the node id, at the level its
# --verbosity asks for. The per-run "running …" / "succeeded …"
# lines are kept quiet here so the demo shows who won each occurrence and what the job said;
# set DEMO_LOG_RUNS=1 to see them.
DEMO_LOG_RUNS = env.bool("DEMO_LOG_RUNS", default=False)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s", "datefmt": "%H:%M:%S"}
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "example_project": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django_cluster_jobs.run": {"level": "INFO" if DEMO_LOG_RUNS else "WARNING"},
    },
}

"""Settings of bench/tasks_drain_db_worker.py: django-tasks-db, in a venv of its own.

Nothing of django-cluster-jobs is installed there: only Django, the django-tasks backport,
django-tasks-db, psycopg and django-environ. DATABASE_URL picks the database.
"""

import environ

env = environ.Env()

SECRET_KEY = "bench-only-not-secret"
DEBUG = False  # DEBUG would also make db_worker reload on code changes
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["django_tasks", "django_tasks_db"]

DATABASES = {
    "default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/taskbench")
}

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

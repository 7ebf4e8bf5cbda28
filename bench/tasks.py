"""The bench's django.tasks task, for bench/tasks_drain.py and bench/tasks_drain_db_worker.py.

The same module serves both: ``@task`` binds the task to the ``default`` backend of whichever
settings load it (ours in bench.settings, django-tasks-db's in bench.settings_tasks_db). It
imports nothing of django-cluster-jobs, so the django-tasks-db venv can import it too.
"""

try:  # Django 6.0 and later
    from django.tasks import task
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task


@task
def noop() -> None:
    """Do nothing: the drain measures the queue, not the work."""

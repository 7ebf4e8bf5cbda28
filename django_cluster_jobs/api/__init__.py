"""An optional REST API over the cluster: jobs, runs, nodes, the leader and the status report.

Install the extra and include the URLs::

    pip install "django-cluster-jobs[api]"

    INSTALLED_APPS = [..., "rest_framework", "django_cluster_jobs"]
    urlpatterns = [..., path("jobs-api/", include("django_cluster_jobs.api.urls"))]

Reads need Django's view permission on the model; actions need
``cluster_jobs.trigger_jobdefinition`` (trigger, enqueue, replay) or
``cluster_jobs.manage_jobdefinition`` (pause, resume, cancel, drain). Every action calls
:mod:`django_cluster_jobs.services`, like the admin and the scheduler. Authentication,
throttling and renderers are the project's own REST framework settings; the ``schema`` URL
serves the API's OpenAPI 3 schema (drf-spectacular).
"""

try:
    import drf_spectacular  # noqa: F401
    import rest_framework  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError(
        "django_cluster_jobs.api needs Django REST framework and drf-spectacular. Install them "
        'with `pip install "django-cluster-jobs[api]"` and add "rest_framework" to '
        "INSTALLED_APPS."
    ) from exc

"""URLs of the API: ``path("jobs-api/", include("django_cluster_jobs.api.urls"))``.

Names live in the ``cluster_jobs_api`` namespace: ``job-list``, ``job-detail``, ``job-trigger``,
``job-enqueue``, ``job-pause``, ``job-resume``, ``run-list``, ``run-detail``, ``run-cancel``,
``run-replay``, ``instance-list``, ``instance-detail``, ``node-list``, ``node-detail``,
``node-drain``, ``leader``, ``status`` and ``schema`` (this API's OpenAPI 3 schema).
"""

from django.urls import path
from rest_framework.routers import SimpleRouter

from . import views
from .schema import SchemaView

app_name = "cluster_jobs_api"

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("runs", views.RunViewSet, basename="run")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("instances", views.InstanceViewSet, basename="instance")

urlpatterns = [
    *router.urls,
    path("leader/", views.LeaderView.as_view(), name="leader"),
    path("status/", views.StatusView.as_view(), name="status"),
    path("schema/", SchemaView.as_view(), name="schema"),
]

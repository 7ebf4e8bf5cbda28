"""URLs of bench/big_ledger.py: the admin and the REST API, as a project mounts them."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("django_cluster_jobs.api.urls")),
]

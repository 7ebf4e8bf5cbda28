"""The example project's URLs: the Django admin, where jobs, runs and nodes can be watched."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]

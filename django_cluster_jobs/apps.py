from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class ClusterJobsConfig(AppConfig):
    name = "django_cluster_jobs"
    label = "cluster_jobs"
    verbose_name = _("Cluster jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, signals  # noqa: F401  (registers checks and signal handlers)

        autodiscover_modules("jobs")

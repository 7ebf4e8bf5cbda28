from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class ClusterJobsConfig(AppConfig):
    name = "django_cluster_jobs"
    label = "cluster_jobs"
    verbose_name = _("Cluster jobs")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from . import checks, signals  # noqa: F401  (registers checks and signal handlers)
        from .ledger.changes import definition_deleted
        from .models import JobDefinition
        from .tasks.hooks import install

        post_delete.connect(
            definition_deleted, sender=JobDefinition, dispatch_uid="cluster_jobs_definitions"
        )
        install()  # the django.tasks backend, where Django or the backport provides the API
        autodiscover_modules("jobs")

"""The bench app: its jobs module is autodiscovered like any application's."""

import os

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    label = "bench"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A script that wants to count the statements of scheduler subprocesses names a
        # directory; each process then writes its counts there when it exits.
        target = os.environ.get("BENCH_COUNT_TO")
        if target:
            from . import counting

            counting.dump_at_exit(counting.install(), target)

"""Clocks injected into scheduler subprocesses through CLUSTER_JOBS['CLOCK']."""

import os
from datetime import timedelta

from django_cluster_jobs.engine import Clock


class EnvSkewedClock(Clock):
    """A node clock that is CLUSTER_JOBS_TEST_SKEW seconds off (negative: behind)."""

    def __init__(self) -> None:
        super().__init__(skew=timedelta(seconds=float(os.environ.get("CLUSTER_JOBS_TEST_SKEW", 0))))

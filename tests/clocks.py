"""Clocks the tests inject: a hand-moved one, and skewed ones for scheduler subprocesses."""

import os
from datetime import datetime, timedelta

from django_cluster_jobs.engine import Clock


class FixedClock(Clock):
    """A clock the test moves by hand."""

    def __init__(self, at: datetime) -> None:
        super().__init__()
        self.at = at

    def local(self) -> datetime:
        return self.at

    def host_offset(self) -> timedelta:
        return timedelta(0)  # the test's time stands for the host's


class EnvSkewedClock(Clock):
    """A node clock that is CLUSTER_JOBS_TEST_SKEW seconds off the host's (negative: behind)."""

    def __init__(self) -> None:
        super().__init__(skew=timedelta(seconds=float(os.environ.get("CLUSTER_JOBS_TEST_SKEW", 0))))


class HostSkewedClock(EnvSkewedClock):
    """A node whose whole view of time is off, the host's clock included: what a process run
    with a faked time sees, SQLite's clock included (SQLite reads the time in the process)."""

    def host_offset(self) -> timedelta:
        return timedelta(0)

"""The admin as the cluster's console: jobs, runs and their timeline, nodes, leases, events.

Ledger rows (runs, events, nodes, leases, cluster events) are read-only: the scheduler owns them.
Operators add and edit database schedules, and act through admin actions that call
:mod:`django_cluster_jobs.services` under the view, trigger and manage permissions.
"""

from ..wording import describe_cron, describe_schedule, interval_text
from .cluster import ClusterEventAdmin, LeaseAdmin, WorkerNodeAdmin
from .jobs import CODE_OWNED, JobDefinitionAdmin
from .runs import JobRunAdmin, RunEventAdmin
from .text import fire_times_table

__all__ = [
    "CODE_OWNED",
    "ClusterEventAdmin",
    "JobDefinitionAdmin",
    "JobRunAdmin",
    "LeaseAdmin",
    "RunEventAdmin",
    "WorkerNodeAdmin",
    "describe_cron",
    "describe_schedule",
    "fire_times_table",
    "interval_text",
]

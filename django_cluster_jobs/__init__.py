"""django-cluster-jobs: scheduled jobs that run exactly once across every replica."""

from importlib.metadata import PackageNotFoundError, version

from .context import RunContext
from .exceptions import (
    ClusterJobsError,
    DuplicateJob,
    ImproperlyDeclared,
    InvalidPayload,
    LockLost,
    LockNotAcquired,
    RegistryNotReady,
    UnknownJob,
)
from .locks import LockHandle, cluster_lock
from .registry import Job, job, registry
from .run_request import RunRequest
from .schedules import Cron, Delay, Every, OnDemand, Startup

try:
    __version__ = version("django-cluster-jobs")
except PackageNotFoundError:  # pragma: no cover - a source tree that was not installed
    __version__ = "0.0.0"

__all__ = [
    "ClusterJobsError",
    "Cron",
    "Delay",
    "DuplicateJob",
    "Every",
    "ImproperlyDeclared",
    "InvalidPayload",
    "Job",
    "LockHandle",
    "LockLost",
    "LockNotAcquired",
    "OnDemand",
    "RegistryNotReady",
    "RunContext",
    "RunRequest",
    "Startup",
    "UnknownJob",
    "__version__",
    "cluster_lock",
    "job",
    "registry",
]

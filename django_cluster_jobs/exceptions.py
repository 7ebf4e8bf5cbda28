"""Exceptions raised by django-cluster-jobs; each carries what is needed to act on it."""

from __future__ import annotations


class ClusterJobsError(Exception):
    """Base class of every error this package raises."""


class ImproperlyDeclared(ClusterJobsError):
    """A job declaration is invalid: names the job, the field, the value and the fix."""

    def __init__(self, job: str, field: str, value: object, hint: str) -> None:
        self.job, self.field, self.value, self.hint = job, field, value, hint
        super().__init__(f"Job {job!r}: invalid {field} {value!r}: {hint}")


class DuplicateJob(ClusterJobsError):
    """Two declarations use the same job name."""

    def __init__(self, name: str, first: str, second: str) -> None:
        self.name, self.first, self.second = name, first, second
        super().__init__(
            f"Job name {name!r} is declared twice: by {first} and by {second}. "
            "Give one of them another name with @job(name=...)."
        )


class UnknownJob(ClusterJobsError):
    """A job name that no code declared."""

    def __init__(self, name: str, known: list[str] | tuple[str, ...] = ()) -> None:
        self.name = name
        choices = ", ".join(sorted(known)) or "none are registered"
        super().__init__(
            f"No job named {name!r} is registered (registered jobs: {choices}). "
            "Declare it with @job in an app's jobs.py, or check the spelling."
        )


class InvalidPayload(ClusterJobsError):
    """A payload that cannot be stored as JSON."""

    def __init__(self, job: str, error: Exception) -> None:
        self.job = job
        super().__init__(
            f"Job {job!r}: the payload is not JSON-serialisable ({error}). "
            "Pass only str, int, float, bool, None, lists and dicts with str keys."
        )


class ImproperlyConfigured(ClusterJobsError):
    """The CLUSTER_JOBS setting is invalid."""


class RegistryNotReady(ClusterJobsError):
    """The job registry was used before Django's app registry was ready."""

    def __init__(self) -> None:
        super().__init__(
            "django-cluster-jobs was used before Django's app registry was ready. "
            "Call django.setup() first, or move the call out of module import time "
            "(into a view, a handler or AppConfig.ready())."
        )


class LockNotAcquired(ClusterJobsError):
    """cluster_lock() could not take the lock before its timeout."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"The cluster lock {name!r} is held by another node.")


class LockLost(ClusterJobsError):
    """A held cluster lock was lost (expired and taken by another holder)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"The cluster lock {name!r} was lost to another holder.")

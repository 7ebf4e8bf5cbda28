"""Exceptions raised by django-cluster-jobs; each carries what is needed to act on it."""

from __future__ import annotations

from django.core import exceptions as django_exceptions


class ClusterJobsError(Exception):
    """Base class of every error this package raises."""


#: Longest rendering of a value in an error message; a longer one is cut and says how long it was.
SHOWN_LENGTH = 120


def shown(value: object) -> str:
    """Return ``repr(value)``, cut to SHOWN_LENGTH characters; never raises."""
    try:
        text = repr(value)
    except Exception:  # a value whose repr fails (or recurses too deep) is named by its type
        return f"<{type(value).__name__} object>"
    if len(text) <= SHOWN_LENGTH:
        return text
    return f"{text[:SHOWN_LENGTH]}… ({len(text)} characters)"


class ImproperlyDeclared(ClusterJobsError):
    """A job declaration is invalid: names the job, the field, the value and the fix."""

    def __init__(self, job: str, field: str, value: object, hint: str) -> None:
        self.job, self.field, self.value, self.hint = job, field, value, hint
        super().__init__(f"Job {job!r}: invalid {field} {shown(value)}: {hint}")


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


class InvalidPayload(ImproperlyDeclared):
    """A payload that cannot be stored or that the handler cannot take (the field is "payload").

    Given ``error``, it says the payload is not JSON (the error tells why); given ``hint``, it
    says what else is wrong with ``value`` and how to fix it.
    """

    def __init__(
        self, job: str, error: Exception | None = None, *, value: object = None, hint: str = ""
    ) -> None:
        self.error = error
        super().__init__(job, "payload", value, hint or f"it is not JSON ({error})")
        if error is not None:
            ClusterJobsError.__init__(
                self,
                f"Job {job!r}: the payload is not JSON-serialisable ({error}). "
                "Pass only str, int, float, bool, None, lists and dicts with str keys.",
            )


class ImproperlyConfigured(ClusterJobsError, django_exceptions.ImproperlyConfigured):
    """The CLUSTER_JOBS setting is invalid (a Django ``ImproperlyConfigured`` too)."""


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

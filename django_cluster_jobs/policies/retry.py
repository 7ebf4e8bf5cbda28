"""Retry policies: whether a failed attempt is tried again, and when; or dead-lettered."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..choices import BackoffKind
from ..exceptions import ImproperlyDeclared


@dataclass(frozen=True)
class Backoff:
    """``base`` seconds before attempt 2, times ``factor`` per further attempt, at most ``cap``.

    ``fixed`` waits ``base`` every time; ``exponential_jitter`` waits a uniformly random time
    between 0 and the exponential delay ("full jitter"), which spreads a herd of retries.
    """

    kind: str = BackoffKind.EXPONENTIAL_JITTER
    base: float = 1.0
    factor: float = 2.0
    cap: float = 600.0

    @classmethod
    def from_dict(cls, job: str, options: dict[str, Any] | None) -> Backoff:
        """Return a job's ``backoff=`` policy; errors name the job, the key and the fix."""
        from ..columns import backoff

        options = {} if options is None else options
        if hint := backoff(options):
            raise ImproperlyDeclared(job, "backoff", options, hint)
        return cls(**options)

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """Return the wait before attempt ``attempt + 1`` after attempt ``attempt`` failed."""
        if self.kind == BackoffKind.FIXED:
            return timedelta(seconds=min(self.base, self.cap))
        seconds = self._exponential(attempt)
        if self.kind == BackoffKind.EXPONENTIAL_JITTER:
            seconds = (rng or random).uniform(0, seconds)
        return timedelta(seconds=seconds)

    def _exponential(self, attempt: int) -> float:
        try:
            return min(self.cap, self.base * self.factor ** max(attempt - 1, 0))
        except OverflowError:  # far past the cap: a stored policy beyond the validator's bounds
            return self.cap


def retryable(attempt: int, max_attempts: int, exception: object, never: tuple[type, ...]) -> bool:
    """True when a failed attempt is tried again: attempts are left and the exception is not one
    the job never retries (compared by class name when it comes from a child process)."""
    if attempt >= max_attempts:
        return False
    if isinstance(exception, str):
        return exception not in {cls.__name__ for cls in never}
    return not (never and isinstance(exception, never))


def final_state(failed_state: str, max_attempts: int) -> str:
    """The state a failed attempt that is not retried ends the run in: dead-lettered when the
    job allowed retries (they ran out, or the error is never retried), else the failure itself."""
    return "dead" if max_attempts > 1 else failed_state

"""Backoff policies: when the next attempt of a failed run is due."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .exceptions import ImproperlyDeclared


@dataclass(frozen=True)
class Backoff:
    """``base`` seconds before attempt 2, times ``factor`` per further attempt, at most ``cap``.

    ``fixed`` waits ``base`` every time; ``exponential_jitter`` waits a uniformly random time
    between 0 and the exponential delay ("full jitter"), which spreads a herd of retries.
    """

    kind: str = "exponential_jitter"
    base: float = 1.0
    factor: float = 2.0
    cap: float = 600.0

    @classmethod
    def from_dict(cls, job: str, options: dict[str, Any] | None) -> Backoff:
        """Return a job's ``backoff=`` policy; errors name the job, the key and the fix."""
        from .columns import backoff

        options = {} if options is None else options
        if hint := backoff(options):
            raise ImproperlyDeclared(job, "backoff", options, hint)
        return cls(**options)

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """Return the wait before attempt ``attempt + 1`` after attempt ``attempt`` failed."""
        if self.kind == "fixed":
            return timedelta(seconds=min(self.base, self.cap))
        seconds = self._exponential(attempt)
        if self.kind == "exponential_jitter":
            seconds = (rng or random).uniform(0, seconds)
        return timedelta(seconds=seconds)

    def _exponential(self, attempt: int) -> float:
        try:
            return min(self.cap, self.base * self.factor ** max(attempt - 1, 0))
        except OverflowError:  # far past the cap: a stored policy beyond the validator's bounds
            return self.cap

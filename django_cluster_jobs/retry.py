"""Backoff policies: when the next attempt of a failed run is due."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .exceptions import ImproperlyDeclared

KINDS = ("fixed", "exponential", "exponential_jitter")


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
        """Validate a job's ``backoff=`` option; errors name the job, the key and the fix."""
        options = dict(options or {})
        unknown = sorted(set(options) - {"kind", "base", "factor", "cap"})
        if unknown:
            raise ImproperlyDeclared(job, "backoff", unknown, "keys are kind, base, factor, cap")
        policy = cls(**options)
        if policy.kind not in KINDS:
            raise ImproperlyDeclared(job, "backoff", policy.kind, f"kind is one of {KINDS}")
        for key in ("base", "factor", "cap"):
            value = getattr(policy, key)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ImproperlyDeclared(job, "backoff", {key: value}, "use a number ≥ 0")
        return policy

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """Return the wait before attempt ``attempt + 1`` after attempt ``attempt`` failed."""
        if self.kind == "fixed":
            return timedelta(seconds=min(self.base, self.cap))
        seconds = min(self.cap, self.base * self.factor ** max(attempt - 1, 0))
        if self.kind == "exponential_jitter":
            seconds = (rng or random).uniform(0, seconds)
        return timedelta(seconds=seconds)

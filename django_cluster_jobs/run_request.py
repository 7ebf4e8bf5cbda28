"""The item of a bulk enqueue (importable before the app registry is ready)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class RunRequest:
    """One run of a bulk enqueue: its payload, and optionally its key, priority and due time."""

    payload: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None
    priority: int | None = None
    at: datetime | None = None

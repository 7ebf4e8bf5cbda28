"""The in-memory heap of next fire times, and the definitions it plans from."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from datetime import datetime

from ..models import JobDefinition
from ..registry import Job, Registry
from ..schedules import Schedule


@dataclass(frozen=True)
class Planned:
    """A definition the node fires: the database row, its registered code and its schedule."""

    definition: JobDefinition
    job: Job
    schedule: Schedule

    @property
    def name(self) -> str:
        return self.definition.name

    def runs_here(self, tags: frozenset[str]) -> bool:
        """True when this node has every tag the job requires."""
        return set(self.definition.requires or ()) <= tags


def load_planned(alias: str, registry: Registry) -> dict[str, Planned]:
    """Return every stored definition whose callable is registered, by name."""
    planned = {}
    for definition in JobDefinition.objects.using(alias).all():
        if definition.callable_name in registry:
            job = registry.get(definition.callable_name)
            planned[definition.name] = Planned(definition, job, definition.get_schedule())
    return planned


class Planner:
    """Due times of the jobs this node fires, earliest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, int, str]] = []
        self._seq = itertools.count()

    def clear(self) -> None:
        self._heap.clear()

    def push(self, due: datetime, name: str) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), name))

    def next_due(self) -> datetime | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: datetime) -> list[tuple[datetime, str]]:
        """Remove and return every entry due at or before ``now``."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            at, _, name = heapq.heappop(self._heap)
            due.append((at, name))
        return due

    def __len__(self) -> int:
        return len(self._heap)

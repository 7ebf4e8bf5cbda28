"""The in-memory heap of next fire times, and the definitions it plans from."""

from __future__ import annotations

import heapq
import itertools
import logging
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from ..models import JobDefinition
from ..registry import Job, Registry
from ..schedules import Schedule
from ..validation import row_errors

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Planned:
    """A definition the node fires: the database row, its registered code and its schedule."""

    definition: JobDefinition
    job: Job
    schedule: Schedule
    #: Other jobs wait for this one: its end decides them in the same transaction.
    leads: bool = False

    @property
    def name(self) -> str:
        return self.definition.name

    def runs_here(self, tags: frozenset[str]) -> bool:
        """True when this node has every tag the job requires."""
        return set(self.definition.requires or ()) <= tags


def load_planned(alias: str, registry: Registry) -> dict[str, Planned]:
    """Return every stored definition whose callable is registered and which the node can use,
    by name. An unusable row is left out and logged with its problem, once per change of it;
    every other job is planned (see :func:`problems`)."""
    planned = {}
    rows = _rows(alias)
    leading = {name for row in rows if isinstance(row.after, list) for name in row.after}
    for definition in rows:
        if definition.callable_name not in registry:
            continue
        found = problems(definition)
        if found:
            _report(definition, found)
            continue
        job = registry.get(definition.callable_name)
        schedule = definition.get_schedule()
        planned[definition.name] = Planned(
            definition, job, schedule, leads=definition.name in leading
        )
    return planned


def _rows(alias: str) -> list[JobDefinition]:
    """Every stored definition; row by row when one cannot even be read (a column a raw SQL
    write filled with what Django cannot convert), leaving that one out, logged."""
    rows = JobDefinition.objects.using(alias)
    try:
        return list(rows.all())
    except (ValueError, TypeError, OverflowError):
        pass
    readable = []
    for pk, name in rows.values_list("pk", "name"):
        try:
            readable.append(rows.get(pk=pk))
        except (ValueError, TypeError, OverflowError) as exc:
            logger.error("job %r cannot be read from the database (%s); it is not planned", name,
                         exc, extra={"job": name})  # fmt: skip
    return readable


def problems(definition: JobDefinition) -> list[str]:
    """Why a stored definition cannot be planned (empty when it can): the validator's verdict,
    and the schedule's own."""
    found = [str(error) for error in row_errors(definition)]
    try:
        schedule = definition.get_schedule()
        if schedule.slotted:  # an interval that reaches past the end of the calendar
            schedule.next_after(definition.settled_through or timezone.now())
    except Exception as exc:  # any stored value: the row is invalid, never the node
        found.append(f"Job {definition.name!r}: its schedule cannot be used: {exc}")
    if not isinstance(definition.payload, dict):
        found.append(f"Job {definition.name!r}: its payload is not a JSON object")
    return found


#: (job name, updated_at) of the invalid rows already logged.
_REPORTED: set[tuple[str, object]] = set()


def _report(definition: JobDefinition, found: list[str]) -> None:
    seen = (definition.name, definition.updated_at)
    if seen in _REPORTED:
        return
    _REPORTED.add(seen)
    logger.error(
        "job %r is not planned until its definition is fixed: %s",
        definition.name,
        "; ".join(found),
        extra={"job": definition.name},
    )


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

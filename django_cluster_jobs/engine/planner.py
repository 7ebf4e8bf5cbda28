"""The in-memory heap of next fire times, and the definitions it plans from."""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet
from django.utils import timezone

from ..exceptions import shown
from ..ledger.settle import JOBS_PER_QUERY
from ..models import JobDefinition
from ..registry import Job, Registry
from ..schedules import Every, Schedule
from ..stored import UNREADABLE, UnreadableRow, columns_unreadable, report
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
    by name (see :meth:`Definitions.load`)."""
    return Definitions(alias, registry).load()


@dataclass(frozen=True)
class Changes:
    """What changed among the stored definitions since a node last loaded them."""

    #: The changed or new definitions the node can use, by name.
    planned: dict[str, Planned]
    #: The names planned before that are no longer (deleted, renamed, now unusable).
    dropped: set[str]


class Definitions:
    """The stored definitions one node loaded, so that it loads again only those that changed.

    Every save of a definition writes its ``updated_at`` (ledger.changes): a reload reads the
    ``(id, updated_at)`` of every row and then only the rows whose mark differs from what this
    node read, the new ones, and those whose callable was not registered here yet.
    """

    def __init__(self, alias: str, registry: Registry) -> None:
        self.alias, self.registry = alias, registry
        #: id -> updated_at of every row this node read.
        self._seen: dict[int, object] = {}
        #: id -> name of the rows this node plans.
        self._names: dict[int, str] = {}
        #: Ids of rows whose callable is not registered: looked at again at every reload.
        self._unresolved: set[int] = set()
        #: Names of the jobs other jobs wait for (Planned.leads), over every stored row.
        self._leading: set[str] = set()

    def load(self) -> dict[str, Planned]:
        """Return every stored definition whose callable is registered and which the node can
        use, by name. An unusable row is left out and logged with its problem, once per change
        of it; every other job is planned (see :func:`problems`)."""
        self._seen, self._names, self._unresolved = {}, {}, set()
        rows = _rows(JobDefinition.objects.using(self.alias))
        self._leading = _leading(row.after for row in rows)
        return self._plan(rows)

    def changes(self, also: Collection[str] = ()) -> Changes:
        """Load the definitions changed since the last load (and those named in ``also``)."""
        stored = JobDefinition.objects.using(self.alias)
        read = _marks(stored)  # one light read of all
        marks = {pk: at for pk, at, _after in read}
        leading = _leading(after for _pk, _at, after in read)
        stale = {pk for pk, at in marks.items() if self._seen.get(pk, _UNSEEN) != at}
        # A job another one now waits for (or no longer does) is planned again, unchanged.
        flipped = leading ^ self._leading
        stale |= {pk for pk, name in self._names.items() if name in flipped and pk in marks}
        stale |= self._unresolved & set(marks)
        stale |= {pk for pk, name in self._names.items() if name in also and pk in marks}
        gone = set(self._seen) - set(marks)
        ids, rows = sorted(stale), []
        for start in range(0, len(ids), JOBS_PER_QUERY):
            rows += _rows(stored.filter(pk__in=ids[start : start + JOBS_PER_QUERY]))
        before = {self._names[pk] for pk in stale | gone if pk in self._names}
        for pk in stale | gone:  # only once everything is read: a failed reload changes nothing
            self._seen.pop(pk, None)
            self._names.pop(pk, None)
            self._unresolved.discard(pk)
        self._leading = leading
        planned = self._plan(rows)
        for pk in stale - {row.pk for row in rows}:  # unreadable: read again once it changes
            self._seen[pk] = marks.get(pk)
        return Changes(planned, before - set(planned))

    def _plan(self, rows: list[JobDefinition]) -> dict[str, Planned]:
        planned = {}
        for definition in rows:
            self._seen[definition.pk] = definition.updated_at
            if definition.callable_name not in self.registry:
                self._unresolved.add(definition.pk)
                continue
            found = problems(definition)
            if found:
                _report(definition, found)
                continue
            job = self.registry.get(definition.callable_name)
            leads = definition.name in self._leading
            planned[definition.name] = Planned(definition, job, definition.get_schedule(), leads)
            self._names[definition.pk] = definition.name
        return planned


_UNSEEN = object()


def _leading(afters: Iterable[object]) -> set[str]:
    """The names that the ``after`` lists (of every stored definition) wait for."""
    lists = (after for after in afters if isinstance(after, list))
    return {name for after in lists for name in after if isinstance(name, str)}


def _marks(stored: QuerySet[JobDefinition]) -> list[tuple[int, object, object]]:
    """(pk, updated_at, after) of every stored definition; row by row when one cannot be read,
    which then has its error for its mark (it is read again, and logged, once it changes)."""
    try:
        return list(stored.values_list("pk", "updated_at", "after"))
    except UNREADABLE:
        pass
    read: list[tuple[int, object, object]] = []
    for pk in stored.values_list("pk", flat=True):
        try:
            read += stored.filter(pk=pk).values_list("pk", "updated_at", "after")
        except UNREADABLE as exc:
            read.append((pk, f"unreadable: {exc}", []))
    return read


def _rows(rows: QuerySet[JobDefinition]) -> list[JobDefinition]:
    """The definitions ``rows`` selects; row by row when one cannot even be read (a column a
    raw SQL write filled with what Django cannot convert), leaving that one out, logged."""
    try:
        readable = list(rows.all())
    except UNREADABLE:
        readable = []
        for pk, name in rows.values_list("pk", "name"):
            try:
                readable.append(rows.get(pk=pk))
            except UNREADABLE as exc:
                if _UNREAD.get(name) != str(exc):  # once per change, not at every reload
                    _UNREAD[name] = str(exc)
                    problems = columns_unreadable(JobDefinition, pk, rows.db) or (str(exc),)
                    report(UnreadableRow(JobDefinition, pk, problems), log=False)  # the metric
                    logger.error("job %s cannot be read from the database (%s); it is not "
                                 "planned", shown(name), exc, extra={"job": name})  # fmt: skip
    for row in readable:
        _UNREAD.pop(row.name, None)
    return readable


def problems(definition: JobDefinition) -> list[str]:
    """Why a stored definition cannot be planned (empty when it can): the validator's verdict,
    and the schedule's own."""
    found = [str(error) for error in row_errors(definition)]
    try:
        schedule = definition.get_schedule()
        if isinstance(schedule, Every):  # an interval that reaches past the end of the calendar
            schedule.next_after(definition.settled_through or timezone.now())
    except Exception as exc:  # any stored value: the row is invalid, never the node
        found.append(f"Job {definition.name!r}: its schedule cannot be used: {exc}")
    if not isinstance(definition.payload, dict):
        found.append(f"Job {definition.name!r}: its payload is not a JSON object")
    return found


#: Why each definition that could not be read was not: logged again only when that changes.
_UNREAD: dict[str, str] = {}
#: (job name, updated_at) of the invalid rows already logged.
_REPORTED: set[tuple[str, object]] = set()


def _report(definition: JobDefinition, found: list[str]) -> None:
    seen = (definition.name, definition.updated_at)
    if seen in _REPORTED:
        return
    _REPORTED.add(seen)
    logger.error(
        "job %s is not planned until its definition is fixed: %s",
        shown(definition.name),  # a name as stored: longer than any column, in a raw write
        "; ".join(found),
        extra={"job": definition.name},
    )


class Planner:
    """Due times of the jobs this node fires, earliest first.

    :meth:`forget` drops a job's entries without rebuilding the heap: they are left in place,
    marked stale by the job's generation, skipped when they come up, and swept out once they
    are half of the heap.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, int, str, int]] = []
        self._seq = itertools.count()
        #: Per job, the generation its current entries carry, and how many it has.
        self._generation: dict[str, int] = {}
        self._entries: dict[str, int] = {}
        self._stale = 0

    def clear(self) -> None:
        self._heap.clear()
        self._generation.clear()
        self._entries.clear()
        self._stale = 0

    def push(self, due: datetime, name: str) -> None:
        generation = self._generation.setdefault(name, 0)
        self._entries[name] = self._entries.get(name, 0) + 1
        heapq.heappush(self._heap, (due, next(self._seq), name, generation))

    def forget(self, name: str) -> None:
        """Drop every entry of ``name`` (it is planned again, or no longer)."""
        if name in self._generation:
            self._generation[name] += 1
        self._stale += self._entries.pop(name, 0)
        if self._stale > 64 and self._stale * 2 > len(self._heap):
            self._heap = [e for e in self._heap if self._current(e)]
            heapq.heapify(self._heap)
            self._stale = 0

    def next_due(self) -> datetime | None:
        self._drop_stale_head()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: datetime) -> list[tuple[datetime, str]]:
        """Remove and return every entry due at or before ``now``."""
        due = []
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._current(entry):
                self._entries[entry[2]] -= 1
                due.append((entry[0], entry[2]))
            else:
                self._stale -= 1
        return due

    def _current(self, entry: tuple[datetime, int, str, int]) -> bool:
        return self._generation.get(entry[2]) == entry[3]

    def _drop_stale_head(self) -> None:
        while self._heap and not self._current(self._heap[0]):
            heapq.heappop(self._heap)
            self._stale -= 1

    def __len__(self) -> int:
        return len(self._heap) - self._stale

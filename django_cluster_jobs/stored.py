"""Reading stored rows back: a value no converter can read is data to report, never an exception
that stops a node.

Every JSON column of the app's tables decodes through :class:`TolerantDecoder`: JSON nested
deeper than READ_DEPTH_MAX levels (Python's decoder fails a little deeper, and a raw SQL write or
another program can store it), or holding a number no float holds, reads as an
:class:`Unreadable` value instead of raising. It is never a dict or a list, so the
one validator refuses it where a dict or a list is required (the definition is left out and
named, a run carrying it fails with that reason and is dead-lettered after its attempts), and
it shows as its reason in the admin and the API.

:data:`UNREADABLE` is what reading a row may raise because of a value (one beyond what Python's
types hold, an interval or a timestamp the driver cannot convert, text that is no date); a lost
connection (OperationalError, InterfaceError) or a wrong query (ProgrammingError) is not among
them.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import DataError, connections, transaction
from django.db.models import Model, QuerySet
from django.db.models.query import BaseIterable
from django.utils.text import capfirst

logger = logging.getLogger(__name__)

QS = TypeVar("QS", bound=QuerySet[Any, Any])


class Unreadable:
    """A stored JSON value that cannot be decoded: why, and how long its text is.

    Stored as it was: saving a row holding one raises TypeError (JSON cannot encode it), so the
    original value is never overwritten with something else.
    """

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"<unreadable JSON: {self.reason}>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unreadable) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(self.reason)


#: The deepest a stored JSON value may nest and still be read. Python's decoder gives up
#: somewhere past a thousand levels, by version and by how deep the caller's stack is; this rule
#: decides the same everywhere (what the doors store nests at most PAYLOAD_DEPTH_MAX levels).
READ_DEPTH_MAX = 500
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def _depth(text: str) -> int:
    """How deep ``text`` nests (brackets within strings left out); 0 when it cannot be deeper
    than READ_DEPTH_MAX, without reading it through."""
    if text.count("[") + text.count("{") <= READ_DEPTH_MAX:
        return 0
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


class _NotFinite(ValueError):
    """A number JSON text can hold and a float cannot (1e400), or NaN or Infinity."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _constant(text: str) -> float:
    raise _NotFinite(text)


class TolerantDecoder(json.JSONDecoder):
    """Decode JSON; an Unreadable for JSON nested deeper than the decoder can follow, or with a
    number no float holds (which could be neither validated nor sent back as JSON)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parse_float", _finite)
        kwargs.setdefault("parse_constant", _constant)
        super().__init__(*args, **kwargs)

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        if (depth := _depth(s)) > READ_DEPTH_MAX:
            return Unreadable(f"nested {depth} levels deep, more than {READ_DEPTH_MAX}")
        try:
            return super().decode(s, *args, **kwargs)
        except RecursionError:
            return Unreadable(f"nested deeper than Python's decoder follows ({len(s)} characters)")
        except _NotFinite as exc:
            return Unreadable(f"the number {str(exc)[:40]} is beyond a float")


def loads(text: str | bytes) -> Any:
    """Decode a JSON column that a raw query returned as text, as the models' fields do."""
    return json.loads(text, cls=TolerantDecoder)


#: What reading a stored row may raise because of the row itself: a value beyond Python's types
#: (OverflowError, an ArithmeticError), one the driver cannot convert (DataError, ValueError),
#: text that is no date (Django's converters then raise TypeError or AttributeError), JSON
#: deeper than the decoder follows when read without TolerantDecoder (RecursionError).
UNREADABLE: tuple[type[Exception], ...] = (
    ArithmeticError, AttributeError, DataError, LookupError, RecursionError, TypeError, ValueError,
)  # fmt: skip


@dataclass(frozen=True)
class UnreadableRow:
    """A stored row no query can read whole: its model, its key, and why, column by column."""

    model: type[Model]
    pk: Any
    problems: tuple[str, ...]

    @property
    def table(self) -> str:
        return self.model._meta.db_table

    def __str__(self) -> str:
        name = capfirst(str(self.model._meta.verbose_name))
        why = "; ".join(self.problems)
        return (f"{name} {self.pk} cannot be read from the database: {why}. Correct that "
                f"value in table {self.table} with SQL, or delete the row.")  # fmt: skip


def columns_unreadable(
    model: type[Model], pk: Any, using: str, *, joined: bool = True
) -> tuple[str, ...]:
    """Why the row ``pk`` of ``model`` cannot be read: each column that fails on its own, with
    the converter's error; then, when none does and ``joined``, the rows it refers to that
    cannot be read (a query that joins them fails with them). Empty when all of that reads."""
    row = model._default_manager.using(using).filter(pk=pk)
    found = []
    for field in model._meta.concrete_fields:
        try:
            with _savepoint(using):
                list(row.values_list(field.attname))
        except UNREADABLE as exc:
            said = str(exc).split("\n", 1)[0][:REASON_SHOWN]
            found.append(f"{field.name}: {type(exc).__name__}: {said}")
    if found or not joined:
        return tuple(found)
    for field in model._meta.concrete_fields:
        if field.is_relation and field.related_model is not None:
            target = row.values_list(field.attname, flat=True).first()
            if target is not None:
                found += (f"its {field.name} {target}: {problem}" for problem in
                          columns_unreadable(field.related_model, target, using,
                                             joined=False))  # fmt: skip
    return tuple(found)


class _Tolerant(BaseIterable):
    """Rows as Django reads them; when one holds a value no converter reads, the others one by
    one, that one left out and reported (:func:`report`). An error that no stored value explains
    is raised: it is a wrong query, not a stored row."""

    #: The iterable this one makes tolerant (Django's ModelIterable, ValuesIterable, ...).
    plain: type[BaseIterable]

    def __iter__(self) -> Iterator[Any]:
        if self.chunked_fetch:  # .iterator(): read as Django reads, in chunks
            yield from super().__iter__()  # type: ignore[misc]
            return
        try:
            # In a savepoint: an error the database raises (a difference beyond an interval)
            # leaves a transaction around the read usable for the reads one by one.
            with _savepoint(self.queryset.db):
                rows = list(super().__iter__())  # type: ignore[misc]
        except UNREADABLE:
            rows = self._each()
        for row in rows:
            problems = mistyped(row) if isinstance(row, Model) else ()
            if problems:
                report(UnreadableRow(type(row), row.pk, problems))
            else:
                yield row

    def _each(self) -> list[Any]:
        queryset = self.queryset
        keys = list(queryset.values_list("pk", flat=True))
        each = queryset.all()
        each.query.clear_limits()
        each._iterable_class = self.plain
        rows: list[Any] = []
        for pk in keys:
            try:
                with _savepoint(queryset.db):
                    rows.extend(each.filter(pk=pk))
            except UNREADABLE:
                problems = columns_unreadable(queryset.model, pk, queryset.db)
                problems = problems or _annotations_unreadable(each.filter(pk=pk))
                if not problems:
                    raise
                report(UnreadableRow(queryset.model, pk, problems))
        return rows


def _annotations_unreadable(row: QuerySet[Any, Any]) -> tuple[str, ...]:
    """The annotations of ``row`` (one row) that cannot be read: a value computed from stored
    ones (another row's time, a difference beyond an interval)."""
    found = []
    for name in row.query.annotations:
        try:
            with _savepoint(row.db):
                list(row.values_list(name))
        except UNREADABLE as exc:
            said = str(exc).split("\n", 1)[0][:REASON_SHOWN]
            found.append(f"its {name}: {type(exc).__name__}: {said}")
    return tuple(found)


#: What a column of each type must read as (SQLite stores what any column is given, and Django
#: converts neither numbers nor flags: text in a number column reads as that text).
_KINDS: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(("IntegerField", "BigIntegerField", "SmallIntegerField", "PositiveIntegerField",
                     "PositiveBigIntegerField", "PositiveSmallIntegerField"), int),
    "FloatField": (int, float),
    "BooleanField": bool,
    "DurationField": timedelta,
    "DateTimeField": datetime,
}  # fmt: skip


def mistyped(row: Model) -> tuple[str, ...]:
    """The columns of ``row`` that hold what their type cannot be (text in a number, an
    infinite float, nothing where a value is required): each as a problem. Deferred columns
    are not read."""
    found = []
    for field in row._meta.concrete_fields:
        kind = _KINDS.get(field.get_internal_type())
        if kind is None or field.generated or field.attname not in row.__dict__:
            continue  # a generated column is the database's own, and may hold NULL
        value = row.__dict__[field.attname]
        if value is None:
            if not field.null:
                found.append(f"{field.name}: holds nothing a {field.get_internal_type()} reads")
            continue
        wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
        if wrong or (isinstance(value, float) and not math.isfinite(value)):
            found.append(f"{field.name}: holds {shown_value(value)}, no "
                         f"{field.get_internal_type()} value")  # fmt: skip
    for name, related in row._state.fields_cache.items():  # joined rows (select_related)
        if isinstance(related, Model):
            found += (f"its {name} {related.pk}: {problem}" for problem in mistyped(related))
    return tuple(found)


def shown_value(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _savepoint(alias: str) -> Any:
    """A savepoint inside a transaction Django opened (an error the database raises leaves
    it usable); nothing outside one, where each read is its own (or inside a transaction the
    caller began itself, as SQLite's take does, where Django cannot open another)."""
    return transaction.atomic(using=alias) if connections[alias].in_atomic_block else nullcontext()


_TOLERANT: dict[type[BaseIterable], type[BaseIterable]] = {}


def tolerant(queryset: QS) -> QS:
    """``queryset`` (of rows: models, values or values lists, not groups), whose rows are read
    one by one when one of them cannot be read, that one left out and reported. For a door
    that lists stored rows: the admin, the API, the status report."""
    iterable = queryset._iterable_class
    if issubclass(iterable, _Tolerant):
        return queryset
    if iterable not in _TOLERANT:
        _TOLERANT[iterable] = type(f"Tolerant{iterable.__name__}", (_Tolerant, iterable),
                                     {"plain": iterable})  # fmt: skip
    clone = queryset.all()
    clone._iterable_class = _TOLERANT[iterable]
    return clone


#: The unreadable rows this process has seen, by (table, key): their problems, logged again
#: only when those change; bounded, so a table full of them cannot grow it without end.
_SEEN: dict[tuple[str, Any], tuple[str, ...]] = {}
_SEEN_MAX = 10_000
REASON_SHOWN = 200


#: The unreadable rows met while :func:`collecting` (each door shows its own).
_MET: ContextVar[list[UnreadableRow] | None] = ContextVar("unreadable_met", default=None)


@contextmanager
def collecting() -> Iterator[list[UnreadableRow]]:
    """Collect the unreadable rows met within the block (a door shows them to its reader)."""
    met: list[UnreadableRow] = []
    token = _MET.set(met)
    try:
        yield met
    finally:
        _MET.reset(token)


def report(row: UnreadableRow, *, log: bool = True) -> None:
    """Hand ``row`` to the current collector; log it (unless the caller logs it in its own
    words) once per change of its problems."""
    met = _MET.get()
    if met is not None and row not in met:
        met.append(row)
    key = (row.table, row.pk)
    if _SEEN.get(key) == row.problems:
        return
    if len(_SEEN) >= _SEEN_MAX:
        _SEEN.clear()
    _SEEN[key] = row.problems
    if log:
            logger.error("%s", row, extra={"table": row.table, "pk": row.pk})


def unreadable_seen() -> dict[str, int]:
    """How many unreadable rows this process has met, by table (for the metrics)."""
    counts: dict[str, int] = {}
    for table, _ in list(_SEEN):
        counts[table] = counts.get(table, 0) + 1
    return counts

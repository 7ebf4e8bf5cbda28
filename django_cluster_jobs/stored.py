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
import math
import re
from typing import Any

from django.db import DataError


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

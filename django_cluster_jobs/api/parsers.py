"""Request bodies the API can hold: JSON nested at most :data:`MAX_DEPTH` levels deep.

A body nested deeper than Python's recursion limit makes the JSON decoder raise RecursionError
(a 500); one just under it decodes, then overflows later, where a run's payload is stored or
shown. Both are refused here as a 400, before any view sees the data.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

#: How many levels of objects and arrays a body may nest (a payload one fewer).
MAX_DEPTH = 32


def depth(value: Any) -> int:
    """Return how many levels of dicts and lists ``value`` nests (a scalar: 0), iteratively."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item)
    return deepest


class BoundedJSONParser(JSONParser):
    """REST framework's JSON parser, refusing bodies nested deeper than :data:`MAX_DEPTH`."""

    too_deep = f"JSON nested deeper than {MAX_DEPTH} levels."

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(self.too_deep) from exc
        if depth(data) > MAX_DEPTH:
            raise ParseError(self.too_deep)
        return data

"""Payloads: JSON objects that every database stores as given, that the handler can take."""

from __future__ import annotations

import inspect
import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from .bounds import PAYLOAD_DEPTH_MAX
from .columns import unstorable
from .exceptions import InvalidPayload

if TYPE_CHECKING:
    from .registry import Job

NOT_A_DICT = (
    "the payload must be a dict of keyword arguments; in the admin and the API, it must be a "
    'JSON object such as {"value": 3}'
)
KEYS_NOT_STR = "its keys must be str, they become keyword names"
TOO_DEEP = (
    f"it nests lists and objects more than {PAYLOAD_DEPTH_MAX} levels deep; flatten it, or "
    "store the data elsewhere and pass its id"
)


def max_bytes() -> int:
    """Return CLUSTER_JOBS['MAX_PAYLOAD_BYTES'], or its default while the setting is unusable."""
    from .conf import Defaults, app_settings

    try:
        value = app_settings.MAX_PAYLOAD_BYTES
    except Exception:  # an unknown CLUSTER_JOBS key: cluster_jobs.E001 reports it
        return Defaults.MAX_PAYLOAD_BYTES
    usable = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if usable else Defaults.MAX_PAYLOAD_BYTES


def cleaned(job: str, payload: Any) -> dict:
    """Return the payload as it will be stored (its JSON round trip), else raise InvalidPayload."""
    if not isinstance(payload, dict):
        raise InvalidPayload(job, TypeError(NOT_A_DICT), value=payload)
    _check_structure(job, payload)
    try:
        text = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:  # a value JSON has no type for, NaN, a huge int
        raise InvalidPayload(job, exc, value=payload) from None
    size, cap = len(text.encode()), max_bytes()
    if size > cap:
        hint = (
            f"it takes {size} bytes as JSON, more than CLUSTER_JOBS['MAX_PAYLOAD_BYTES'] "
            f"({cap}), and it is copied into every run; store the data elsewhere and pass its id"
        )
        raise InvalidPayload(job, value=payload, hint=hint)
    return json.loads(text)


def _check_structure(job: str, payload: dict) -> None:
    """Refuse keys that are not str, NUL characters and deep nesting (without recursing)."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if hint := unstorable(value):
                raise InvalidPayload(job, value=payload, hint=f"a string in it: {hint}")
            continue
        if not isinstance(value, dict | list | tuple):
            continue
        if depth > PAYLOAD_DEPTH_MAX:
            raise InvalidPayload(job, value=payload, hint=TOO_DEEP)
        if isinstance(value, dict):
            if not all(isinstance(key, str) for key in value):
                raise InvalidPayload(job, TypeError(KEYS_NOT_STR), value=payload)
            stack.extend((item, depth) for item in value)  # keys, checked for NUL
            value = value.values()
        stack.extend((item, depth + 1) for item in value)


@lru_cache(maxsize=4096)
def _cached_signature(func: Any) -> inspect.Signature:
    return inspect.signature(func)


def signature_of(func: Any) -> inspect.Signature:
    """The signature of a handler, read once per function (code does not change while the
    process runs; reading it is most of an enqueue's own CPU time otherwise)."""
    try:
        return _cached_signature(func)
    except TypeError:  # an unhashable callable, which the cache refuses (or an unreadable one)
        return inspect.signature(func)


def bind(job: str, handler: Job, payload: dict, *, complete: bool) -> None:
    """Raise InvalidPayload unless the handler takes ``payload`` as keyword arguments.

    ``complete`` asks for every argument the handler needs (a run that fires on its own gets
    only this payload); otherwise the arguments left out may come with each run.
    """
    try:
        signature = signature_of(handler.func)
        context = (None,) if handler.wants_context else ()
    except (TypeError, ValueError):  # a callable whose signature Python cannot read
        return
    try:
        (signature.bind if complete else signature.bind_partial)(*context, **payload)
    except TypeError as exc:
        hint = (
            f"the handler {handler.origin} cannot take it as keyword arguments ({exc}); give "
            "the arguments it names, and no others"
        )
        raise InvalidPayload(job, value=payload, hint=hint) from None

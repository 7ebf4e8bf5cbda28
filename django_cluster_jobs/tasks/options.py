"""The backend's OPTIONS: the job policies every task of the backend starts from."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .. import validation
from ..exceptions import ImproperlyDeclared

#: OPTIONS key → the job column it sets; each is validated like the decorator's option.
KEYS = {
    "MAX_ATTEMPTS": "max_attempts",
    "BACKOFF": "backoff",
    "TIMEOUT": "timeout",
    "DELIVERY": "delivery",
}


def option_of(column: str) -> str:
    """The OPTIONS key that sets ``column`` (``OPTIONS`` itself for a problem of the whole)."""
    keys = {value: key for key, value in KEYS.items()}
    return f"OPTIONS[{keys[column]!r}]" if column in keys else column


def policies_from(alias: str, options: Any) -> tuple[dict[str, Any], list[ImproperlyDeclared]]:
    """Return the job columns OPTIONS ask for and every problem found in them."""
    label = f"TASKS[{alias!r}]"
    if not isinstance(options, dict):
        hint = f"OPTIONS must be a dict with any of {', '.join(KEYS)}"
        return {}, [ImproperlyDeclared(label, "OPTIONS", options, hint)]
    unknown = sorted(str(key) for key in options if key not in KEYS)
    if unknown:
        hint = f"unknown key(s) {', '.join(unknown)}; valid: {', '.join(KEYS)}"
        return {}, [ImproperlyDeclared(label, "OPTIONS", options, hint)]
    policies = {KEYS[key]: _value(KEYS[key], value) for key, value in options.items()}
    return policies, validation.definition_errors(policies, job=label)


def _value(column: str, value: Any) -> Any:
    """A TIMEOUT in seconds becomes a duration; everything else is taken as given."""
    if column == "timeout" and isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    return value

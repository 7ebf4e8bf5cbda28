"""One rule per JobDefinition column: it returns None for a usable value, else the fix."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from . import bounds as b
from . import schedules
from .exceptions import ImproperlyDeclared

Rule = Callable[[Any], "str | None"]

NUL_HINT = "remove the NUL character (\\x00): PostgreSQL cannot store it"
SURROGATE_HINT = "remove the lone surrogate (\\ud800-\\udfff): no database stores it as text"
TAGS_HINT = 'list the node tags the job needs as strings, like ["gpu"]'
#: What croniter picks at random (R) or by a hash it is never given here (H): every node would
#: compute other occurrences, so no two would claim the same one.
RANDOM_FIELD = re.compile(r"(?<![a-z])[rh](?![a-z])", re.IGNORECASE)
#: The cron macros croniter knows, written out (stored expressions are always fields).
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def text(limit: int, *, blank: bool = False) -> Rule:
    """A str of at most ``limit`` characters without NUL (empty only when ``blank``)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"use a str of at most {limit} characters"
        if not value and not blank:
            return f"use a non-empty str of at most {limit} characters"
        if len(value) > limit:
            return f"use at most {limit} characters (this one has {len(value)})"
        return unstorable(value)

    return check


def unstorable(value: str) -> str | None:
    """Return why a database cannot store the text ``value`` (NUL, a lone surrogate), or None."""
    if "\x00" in value:
        return NUL_HINT
    if not value.isascii() and not _encodes(value):
        return SURROGATE_HINT
    return None


def holds_an_id(text: str) -> bool:
    """Whether ``text`` (from a URL or a query string) is an id a row can have: ASCII digits,
    leading zeros allowed, at most ID_MAX. Anything else names no row: the caller answers
    "not found" or "invalid", never a query the database refuses."""
    digits = text.lstrip("0") or "0"
    return text.isascii() and text.isdigit() and len(digits) <= len(str(b.ID_MAX)) \
        and int(digits) <= b.ID_MAX  # fmt: skip


def holds_a_name(text: str) -> bool:
    """Whether ``text`` can be a stored job name or node id: within NAME_MAX_LENGTH, and text a
    database can store (see :func:`unstorable`)."""
    return len(text) <= b.NAME_MAX_LENGTH and unstorable(text) is None


def _encodes(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def choice(choices: tuple[str, ...]) -> Rule:
    """One of ``choices``."""
    hint = f"choose one of {', '.join(choices)}"
    return lambda value: None if isinstance(value, str) and value in choices else hint


def whole(low: int, high: int, *, optional: bool = False, note: str = "") -> Rule:
    """A whole number from ``low`` to ``high`` (or None when ``optional``)."""
    span = f", 1 or more, at most {high}" if low == 1 else f" from {low} to {high}"
    hint = f"use a whole number{span}{note}" + (", or None" if optional else "")

    def check(value: Any) -> str | None:
        if optional and value is None:
            return None
        number = isinstance(value, int) and not isinstance(value, bool)
        return None if number and low <= value <= high else hint

    return check


def duration(longest: timedelta) -> Rule:
    """None, or a positive timedelta of at most ``longest``."""

    def check(value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, timedelta) or value <= timedelta(0):
            return "use a positive datetime.timedelta, or None"
        return _at_most(value, longest)

    return check


def _at_most(value: timedelta, longest: timedelta) -> str | None:
    return None if value <= longest else f"use at most {longest.days} days"


def interval(value: Any) -> str | None:
    """None (a schedule without one), or a positive whole number of ms of at most MAX_INTERVAL."""
    if value is None:
        return None
    try:
        schedules.Delay(value)
    except ImproperlyDeclared as exc:
        return exc.hint
    return _at_most(value, b.MAX_INTERVAL)


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "use True or False"


def moment(value: Any) -> str | None:
    return None if value is None or isinstance(value, datetime) else "use a datetime, or None"


def name(value: Any) -> str | None:
    """A job name the API's URLs can route."""
    if hint := text(b.NAME_MAX_LENGTH)(value):
        return hint
    if "<locals>" in value or "<lambda>" in value:
        return (
            "a function defined inside another one, or a lambda, has no name that stays the "
            "same: pass one with @job(name=...), e.g. @job(name='reports.nightly')"
        )
    if not b.NAME_PATTERN.fullmatch(value):
        return (
            "use letters, digits and _ . : - only, starting with a letter, a digit or _ "
            "(the name is part of the API's URLs)"
        )
    return None


def requires(value: Any) -> str | None:
    """An iterable (list, tuple, set) of node tags, each a non-empty str."""
    if isinstance(value, str):
        return f"{TAGS_HINT}: an iterable of str, e.g. {{{value!r}}} (a str alone is its letters)"
    if not isinstance(value, list | tuple | set | frozenset):
        return TAGS_HINT
    if len(value) > b.TAGS_MAX:
        return f"{TAGS_HINT}, at most {b.TAGS_MAX} of them"
    tag = text(b.TAG_MAX_LENGTH)
    faults = [f"the tag {t!r}: {hint}" for t in value if (hint := tag(t))]
    return f"{TAGS_HINT}; {faults[0]}" if faults else None


AFTER_HINT = "list the names of the jobs that must succeed first, like ['pipeline.extract']"


def after(value: Any) -> str | None:
    """A list (or tuple) of distinct job names: the predecessors."""
    if not isinstance(value, list | tuple):
        return AFTER_HINT
    if len(value) > b.AFTER_MAX:
        return f"{AFTER_HINT}, at most {b.AFTER_MAX} of them"
    faults = [f"the name {n!r}: {hint}" for n in value if (hint := name(n))]
    if faults:
        return f"{AFTER_HINT}; {faults[0]}"
    twice = sorted({n for n in value if value.count(n) > 1})
    return f"name each predecessor once ({', '.join(twice)} is given twice)" if twice else None


def backoff(value: Any) -> str | None:
    """A dict of kind, base, factor and cap (each optional)."""
    keys = ", ".join(b.BACKOFF_KEYS)
    if not isinstance(value, dict):
        return f"use a dict with the keys {keys} (each optional), e.g. {{'base': 2}}"
    unknown = sorted(str(key) for key in value if key not in b.BACKOFF_KEYS)
    if unknown:
        return f"unknown key(s) {', '.join(unknown)}: the keys are {keys}"
    if choice(b.BACKOFF_KINDS)(value.get("kind", "exponential_jitter")):
        return f"its kind is one of {', '.join(b.BACKOFF_KINDS)}"
    limits = {"base": b.BACKOFF_SECONDS_MAX, "factor": b.BACKOFF_FACTOR_MAX}
    for key, high in {**limits, "cap": b.BACKOFF_SECONDS_MAX}.items():
        if key in value and not _number(value[key], high):
            return f"its {key} must be a number, 0 or more and at most {high:g}"
    return None


def _number(value: Any, high: float) -> bool:
    # Comparisons, never float(): a huge int compares exactly, and NaN compares False.
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and 0 <= value <= high


def zone(value: str) -> str | None:
    """An IANA time zone name."""
    try:
        ZoneInfo(value)
    except Exception:  # not found, a path, a NUL, a name too long for the file system
        return schedules.ZONE_HINT
    return None


def cron(expr: str) -> str | None:
    """A cron expression every node reads alike."""
    stripped = expr.strip()
    if stripped.startswith("@"):
        return _macro(stripped)
    if RANDOM_FIELD.search(expr):
        return (
            "R (random) and H (hashed) differ from one process to the next, so every node "
            "would compute other occurrences; write the minutes and hours out"
        )
    try:
        schedules.from_fields(schedules.Cron.kind, expr)
    except ImproperlyDeclared as exc:
        return exc.hint
    except Exception as exc:  # whatever croniter makes of an odd expression
        return f"not a valid cron expression ({exc})"
    return None


def _macro(macro: str) -> str:
    if macro.lower() in MACROS:
        return f"cron macros are not supported; write it as cron={MACROS[macro.lower()]!r}"
    if macro.lower() == "@reboot":
        return "to run when each scheduler starts, use startup=True (kind 'at startup')"
    return "write the 5 fields (minute hour day month weekday) instead of a macro"


#: The rule of each column, in the models' order (problems are reported in this order).
RULES: dict[str, Rule] = {
    "name": name,
    "callable_name": text(b.NAME_MAX_LENGTH),
    "source": choice(b.SOURCES),
    "schedule_kind": choice(b.SCHEDULE_KINDS),
    "cron": text(b.CRON_MAX_LENGTH, blank=True),
    "timezone": text(b.TIMEZONE_MAX_LENGTH),
    "interval": interval,
    "placement": choice(b.PLACEMENTS),
    "delivery": choice(b.DELIVERIES),
    "overlap": choice(b.OVERLAPS),
    "misfire": choice(b.MISFIRES),
    "catch_up_window": duration(b.MAX_WINDOW),
    "catch_up_limit": whole(1, b.CATCH_UP_LIMIT_MAX),
    "max_attempts": whole(1, b.MAX_ATTEMPTS),
    "backoff": backoff,
    "breaker_threshold": whole(1, b.COUNT_MAX, optional=True),
    "breaker_cooldown": duration(b.MAX_COOLDOWN),
    "executor": choice(b.EXECUTORS),
    "timeout": duration(b.MAX_TIMEOUT),
    "priority": whole(b.PRIORITY_MIN, b.PRIORITY_MAX, note=" (larger runs sooner)"),
    "queue": text(b.QUEUE_MAX_LENGTH),
    "max_concurrency": whole(1, b.COUNT_MAX, optional=True),
    "requires": requires,
    "after": after,
    "payload": lambda value: None,  # payloads.cleaned checks it, and binds it to the handler
    "enabled": boolean,
    "paused_until": moment,
    "pause_reason": text(b.PAUSE_REASON_MAX_LENGTH, blank=True),
}


def run_at(value: Any) -> str | None:
    """An aware datetime from EARLIEST_RUN_AT to LATEST_RUN_AT."""
    try:
        aware = isinstance(value, datetime) and value.utcoffset() is not None
        usable = aware and b.EARLIEST_RUN_AT <= value <= b.LATEST_RUN_AT
    except Exception:  # a tzinfo that fails, or a time that cannot be compared
        usable = False
    if usable:
        return None
    return (
        f"use an aware datetime from {b.EARLIEST_RUN_AT:%Y-%m-%d} to "
        f"{b.LATEST_RUN_AT:%Y-%m-%d} (UTC), e.g. datetime(2030, 1, 1, tzinfo=UTC)"
    )

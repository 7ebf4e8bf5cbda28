"""When jobs fire: cron, fixed rate, fixed delay, startup and on demand.

Every method takes and returns aware UTC datetimes. Occurrence keys come from the schedule, never
from a node's ``now()``, so every node computes the same key for the same occurrence.

Daylight-saving rule for cron in a local time zone (documented in docs/reference/schedules.md):
a local time skipped by a spring-forward fires once, shifted forward by the length of the gap
(02:30 on the America/New_York spring-forward day fires at 03:30 EDT); a local time repeated by a
fall-back fires once, at its first (daylight-time) instance. Each wall-clock time fires at most
once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from .exceptions import ImproperlyDeclared

#: Upper bound of croniter steps while resolving one occurrence across a DST fold.
_MAX_STEPS = 100_000
#: How far back to look for a spring-forward transition (longer than any real DST gap).
_LOOKBACK = timedelta(days=1)
#: The fix for a time zone that ZoneInfo does not know.
ZONE_HINT = "not an IANA time zone name; use one such as 'UTC' or 'Europe/Paris'"


def occurrence_key(at: datetime) -> str:
    """Return the deterministic key of the occurrence at ``at`` (UTC, second or ms precision)."""
    at = _utc(at)
    text = at.strftime("%Y-%m-%dT%H:%M:%S")
    if millis := at.microsecond // 1000:
        text += f".{millis:03d}"
    return text + "Z"


def _utc(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError("schedules work on aware datetimes; got a naive one")
    return at.astimezone(UTC)


def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    # A directory ("Europe") or a name too long for the file system raises OSError.
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError) as exc:
        raise ImproperlyDeclared("?", "tz", tz, ZONE_HINT) from exc


def _resolve(wall: datetime, zone: ZoneInfo) -> datetime:
    """Map a naive local wall time to UTC by the documented DST rule (fold=0 in both cases)."""
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)


def _search_start(after: datetime, zone: ZoneInfo) -> datetime:
    """Return the naive wall time from which to look for the first occurrence after ``after``.

    Just after a spring-forward, a skipped wall time (02:30) fires later than it reads (03:30), so
    the search starts one gap earlier than ``after``'s own wall time, or it would miss it.
    """
    wall = after.astimezone(zone).replace(tzinfo=None)
    gap = _offset(after, zone) - _offset(after - _LOOKBACK, zone)
    if gap > timedelta(0) and _offset(after - gap, zone) != _offset(after, zone):
        return wall - gap
    return wall


def _offset(at: datetime, zone: ZoneInfo) -> timedelta:
    """The zone's UTC offset at the aware instant ``at`` (a ZoneInfo always has one)."""
    return at.astimezone(zone).utcoffset() or timedelta(0)


class Schedule:
    """Base class: the kinds of schedule and what the node loop asks of them."""

    kind: ClassVar[str]
    #: True when the occurrence is a fixed instant every node can name (slot claim).
    slotted: ClassVar[bool] = False

    def next_after(self, after: datetime) -> datetime | None:
        """Return the first occurrence strictly after ``after``, or None if there is none."""
        return None

    def previous_at_or_before(self, at: datetime) -> datetime | None:
        """Return the last occurrence at or before ``at``, or None."""
        return None

    def snap(self, at: datetime) -> datetime:
        """Return the occurrence nearest to ``at`` (ties go to the earlier one)."""
        at = _utc(at)
        before, after = self.previous_at_or_before(at), self.next_after(at)
        if before is None or after is None:
            return before or after or at
        return before if at - before <= after - at else after

    def upcoming(self, after: datetime, count: int) -> list[datetime]:
        """Return up to ``count`` occurrences after ``after``."""
        found: list[datetime] = []
        at = after
        while len(found) < count:
            following = self.next_after(at)
            if following is None:
                break
            found.append(following)
            at = following
        return found

    def longest_gap(self) -> timedelta | None:
        """Return the longest interval between two occurrences, when it is fixed."""
        return None

    def describe(self) -> str:
        return self.kind


@dataclass(frozen=True)
class Cron(Schedule):
    """A 5-field (minute first) or 6-field (second first) cron expression in an IANA time zone."""

    expr: str
    tz: str = "UTC"
    kind: ClassVar[str] = "cron"
    slotted: ClassVar[bool] = True
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = self.expr.split()
        if len(fields) not in (5, 6):
            raise ImproperlyDeclared(
                "?",
                "cron",
                self.expr,
                f"a cron expression has 5 fields (minute hour day month weekday) or 6 "
                f"(second first); this one has {len(fields)}",
            )
        if not croniter.is_valid(self.expr, second_at_beginning=self._six):
            raise ImproperlyDeclared(
                "?",
                "cron",
                self.expr,
                "not a valid cron expression (check ranges, steps and names, "
                "e.g. '*/15 9-17 * * mon-fri')",
            )
        try:
            self._iter(datetime(2000, 1, 1)).get_next(datetime)
        except CroniterBadDateError:
            raise ImproperlyDeclared(
                "?",
                "cron",
                self.expr,
                "this expression never fires (a day that its months do not have, e.g. 30 2)",
            ) from None
        object.__setattr__(self, "_zone", _zone(self.tz))

    @property
    def _six(self) -> bool:
        return len(self.expr.split()) == 6

    def _iter(self, wall: datetime, *, backwards: bool = False) -> croniter:
        return croniter(self.expr, wall, second_at_beginning=self._six, is_prev=backwards)

    def next_after(self, after: datetime) -> datetime | None:
        after = _utc(after)
        steps = self._iter(_search_start(after, self._zone))
        for _ in range(_MAX_STEPS):
            candidate = _resolve(steps.get_next(datetime), self._zone)
            if candidate > after:
                return candidate
        return None  # pragma: no cover - needs a fold longer than _MAX_STEPS occurrences

    def previous_at_or_before(self, at: datetime) -> datetime | None:
        at = _utc(at)
        wall = at.astimezone(self._zone).replace(tzinfo=None) + timedelta(microseconds=1)
        steps = self._iter(wall, backwards=True)
        for _ in range(_MAX_STEPS):
            found = _resolve(steps.get_prev(datetime), self._zone)
            if found <= at:
                break
        else:  # pragma: no cover
            return None
        # Inside a repeated hour the backward walk can land early; walk forward to the last one.
        while (later := self.next_after(found)) is not None and later <= at:
            found = later
        return found

    def describe(self) -> str:
        return f"cron {self.expr!r} ({self.tz})"


@dataclass(frozen=True)
class Every(Schedule):
    """Fixed rate: slots ``anchor + k * interval``; the anchor is the cluster-wide EPOCH setting."""

    interval: timedelta
    anchor: datetime | None = None
    kind: ClassVar[str] = "every"
    slotted: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_interval("every", self.interval)
        if self.anchor is not None:
            if not isinstance(self.anchor, datetime) or self.anchor.tzinfo is None:
                raise ImproperlyDeclared("?", "anchor", self.anchor, "pass an aware datetime")
            object.__setattr__(self, "anchor", _utc(self.anchor))

    def _anchor(self) -> datetime:
        if self.anchor is not None:
            return self.anchor
        from .conf import app_settings

        return _utc(app_settings.EPOCH)

    def next_after(self, after: datetime) -> datetime | None:
        anchor = self._anchor()
        slots = (_utc(after) - anchor) // self.interval + 1
        return anchor + slots * self.interval

    def previous_at_or_before(self, at: datetime) -> datetime | None:
        anchor = self._anchor()
        return anchor + ((_utc(at) - anchor) // self.interval) * self.interval

    def longest_gap(self) -> timedelta:
        return self.interval

    def describe(self) -> str:
        return f"every {self.interval}"


@dataclass(frozen=True)
class Delay(Schedule):
    """Fixed delay: due one ``interval`` after the previous run finished anywhere in the cluster."""

    interval: timedelta
    kind: ClassVar[str] = "delay"

    def __post_init__(self) -> None:
        _check_interval("delay", self.interval)

    def longest_gap(self) -> timedelta:
        return self.interval

    def describe(self) -> str:
        return f"{self.interval} after the previous run"


@dataclass(frozen=True)
class Startup(Schedule):
    """Once on every node, when its scheduler starts."""

    kind: ClassVar[str] = "startup"

    def describe(self) -> str:
        return "at scheduler start, on every node"


@dataclass(frozen=True)
class OnDemand(Schedule):
    """Never on its own: only enqueued, manual or external runs."""

    kind: ClassVar[str] = "on_demand"

    def describe(self) -> str:
        return "on demand only"


def _check_interval(name: str, interval: object) -> timedelta:
    """Return ``interval`` when it is a usable one; else raise ImproperlyDeclared."""
    if not isinstance(interval, timedelta):
        raise ImproperlyDeclared("?", name, interval, "pass a datetime.timedelta")
    if interval <= timedelta(0):
        raise ImproperlyDeclared("?", name, interval, "the interval must be positive")
    if interval % timedelta(milliseconds=1):
        raise ImproperlyDeclared("?", name, interval, "use a whole number of milliseconds")
    return interval


@functools.lru_cache(maxsize=4096)
def from_fields(
    kind: str, cron: str = "", tz: str = "UTC", interval: timedelta | None = None
) -> Schedule:
    """Build a schedule from the columns of a JobDefinition row.

    Schedules are immutable values, so the same columns share one (a node loading many jobs
    parses each distinct cron expression once); what cannot be built raises every time."""
    if kind == Cron.kind:
        return Cron(cron, tz or "UTC")
    if kind == Every.kind:
        return Every(_check_interval(Every.kind, interval))
    if kind == Delay.kind:
        return Delay(_check_interval(Delay.kind, interval))
    if kind == Startup.kind:
        return Startup()
    return OnDemand()


def to_fields(schedule: Schedule) -> dict[str, object]:
    """Return the JobDefinition columns that describe ``schedule``."""
    return {
        "schedule_kind": schedule.kind,
        "cron": getattr(schedule, "expr", ""),
        "timezone": getattr(schedule, "tz", "UTC"),
        "interval": getattr(schedule, "interval", None),
    }

"""The code-declared job set: the ``@job`` decorator and the registry it fills."""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, overload

from django.apps import apps

from . import schedules
from .context import RunContext
from .exceptions import (
    DuplicateJob,
    ImproperlyDeclared,
    InvalidPayload,
    RegistryNotReady,
    UnknownJob,
)
from .retry import Backoff

PLACEMENTS = ("cluster", "every_node")
DELIVERIES = ("at_least_once", "at_most_once")
OVERLAPS = ("skip", "allow", "buffer_one", "cancel_other")
MISFIRES = ("fire_once", "skip", "run_all")
EXECUTORS = ("thread", "process")


@dataclass(frozen=True)
class Job:
    """A declared job: its callable, schedule and policies. Calling it calls the function."""

    name: str
    func: Callable[..., Any]
    schedule: schedules.Schedule
    placement: str = "cluster"
    delivery: str = "at_least_once"
    overlap: str = "skip"
    misfire: str = "fire_once"
    catch_up_window: timedelta | None = None
    catch_up_limit: int = 10
    max_attempts: int = 1
    backoff: dict = field(default_factory=dict)
    dont_retry: tuple[type[BaseException], ...] = ()
    breaker_threshold: int | None = None
    breaker_cooldown: timedelta | None = None
    timeout: timedelta | None = None
    executor: str = "thread"
    priority: int = 0
    queue: str = "default"
    max_concurrency: int | None = None
    requires: frozenset[str] = frozenset()
    payload: dict = field(default_factory=dict)
    enabled: bool = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @property
    def origin(self) -> str:
        """Where the job was declared, as module.qualname."""
        return f"{self.func.__module__}.{self.func.__qualname__}"

    @property
    def wants_context(self) -> bool:
        """True when the handler's first parameter receives the RunContext."""
        return _wants_context(self.func)

    def definition_fields(self) -> dict[str, Any]:
        """Return the JobDefinition columns for this code declaration."""
        return {
            "callable_name": self.name,
            "source": "code",
            **schedules.to_fields(self.schedule),
            "placement": self.placement,
            "delivery": self.delivery,
            "overlap": self.overlap,
            "misfire": self.misfire,
            "catch_up_window": self.catch_up_window,
            "catch_up_limit": self.catch_up_limit,
            "max_attempts": self.max_attempts,
            "backoff": self.backoff,
            "breaker_threshold": self.breaker_threshold,
            "breaker_cooldown": self.breaker_cooldown,
            "timeout": self.timeout,
            "executor": self.executor,
            "priority": self.priority,
            "queue": self.queue,
            "max_concurrency": self.max_concurrency,
            "requires": sorted(self.requires),
            "payload": self.payload,
        }

    def enqueue(
        self, *, idempotency_key: str | None = None, priority: int | None = None, **payload: Any
    ) -> Any:
        """Run this job once, as soon as a node is free; returns the pending JobRun.

        Keyword arguments become the handler's payload, except two reserved ones: with
        ``idempotency_key`` a second enqueue returns the first run; ``priority`` overrides the
        job's. Call it inside ``transaction.on_commit`` to enqueue only if your data commits.
        """
        from .services import enqueue

        return enqueue(self.name, payload, key=idempotency_key, priority=priority)

    def enqueue_at(
        self,
        when: Any,
        *,
        idempotency_key: str | None = None,
        priority: int | None = None,
        **payload: Any,
    ) -> Any:
        """Run this job once at ``when`` (an aware datetime); returns the pending JobRun."""
        from .services import enqueue

        return enqueue(self.name, payload, at=when, key=idempotency_key, priority=priority)

    def invoke(self, context: RunContext, payload: dict) -> Any:
        """Call the handler with the context (when it takes one) and the payload as kwargs."""
        if self.wants_context:
            return self.func(context, **payload)
        return self.func(**payload)


def _signature(func: Callable[..., Any]) -> inspect.Signature:
    # Resolve string annotations (``from __future__ import annotations``) when they can be.
    try:
        return inspect.signature(func, eval_str=True)
    except Exception:
        return inspect.signature(func)


def _wants_context(func: Callable[..., Any]) -> bool:
    params = list(_signature(func).parameters.values())
    if not params or params[0].kind not in (
        params[0].POSITIONAL_ONLY,
        params[0].POSITIONAL_OR_KEYWORD,
    ):
        return False
    first = params[0]
    return first.annotation in (RunContext, "RunContext") or first.name in ("ctx", "context")


class Registry:
    """Job name → Job; filled at import of each app's jobs.py."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def register(self, job: Job) -> Job:
        with self._lock:
            existing = self._jobs.get(job.name)
            if existing is not None and existing.origin != job.origin:
                raise DuplicateJob(job.name, existing.origin, job.origin)
            self._jobs[job.name] = job
        return job

    def unregister(self, name: str) -> None:
        with self._lock:
            self._jobs.pop(name, None)

    def get(self, name: str) -> Job:
        self.check_ready()
        try:
            return self._jobs[name]
        except KeyError:
            raise UnknownJob(name, tuple(self._jobs)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    def __iter__(self) -> Iterator[Job]:
        return iter(list(self._jobs.values()))

    def names(self) -> list[str]:
        return sorted(self._jobs)

    @staticmethod
    def check_ready() -> None:
        if not apps.ready:
            raise RegistryNotReady


registry = Registry()


def _schedule_from(job_name: str, **given: Any) -> schedules.Schedule:
    chosen = {key: value for key, value in given.items() if value not in (None, False)}
    chosen.pop("tz", None)
    if len(chosen) > 1:
        raise ImproperlyDeclared(
            job_name,
            "schedule",
            sorted(chosen),
            "give at most one of cron=, every=, delay=, startup=, schedule=",
        )
    if given["schedule"] is not None:
        if not isinstance(given["schedule"], schedules.Schedule):
            raise ImproperlyDeclared(
                job_name, "schedule", given["schedule"], "pass a Schedule object"
            )
        anchor = getattr(given["schedule"], "anchor", None)
        if anchor is not None:
            raise ImproperlyDeclared(
                job_name,
                "schedule",
                given["schedule"],
                "a job's fixed-rate grid is always anchored on CLUSTER_JOBS['EPOCH'], so that "
                "every node computes the same slots; drop anchor= (or change EPOCH)",
            )
        return given["schedule"]
    if given["cron"] is not None:
        return schedules.Cron(given["cron"], given["tz"] or "UTC")
    if given["every"] is not None:
        return schedules.Every(given["every"])
    if given["delay"] is not None:
        return schedules.Delay(given["delay"])
    return schedules.Startup() if given["startup"] else schedules.OnDemand()


def _check_choice(job_name: str, field_name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ImproperlyDeclared(job_name, field_name, value, f"choose one of {', '.join(choices)}")


def check_payload(job_name: str, payload: dict) -> dict:
    """Return ``payload`` if it is a dict of JSON values with str keys; else InvalidPayload."""
    if not isinstance(payload, dict):
        raise InvalidPayload(job_name, TypeError("the payload must be a dict of keyword arguments"))
    if not all(isinstance(key, str) for key in payload):
        raise InvalidPayload(job_name, TypeError("its keys must be str, they become keyword names"))
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(job_name, exc) from exc
    return dict(payload)


def _build(func: Callable[..., Any], options: dict[str, Any]) -> Job:
    name = options.pop("name") or f"{func.__module__}.{func.__qualname__}"
    sched_args = {
        k: options.pop(k) for k in ("cron", "tz", "every", "delay", "startup", "schedule")
    }
    try:
        schedule = _schedule_from(name, **sched_args)
    except ImproperlyDeclared as exc:
        raise ImproperlyDeclared(name, exc.field, exc.value, exc.hint) from None
    for field_name, choices in (
        ("placement", PLACEMENTS),
        ("delivery", DELIVERIES),
        ("overlap", OVERLAPS),
        ("misfire", MISFIRES),
    ):
        _check_choice(name, field_name, options[field_name], choices)
    attempts = options["max_attempts"]
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ImproperlyDeclared(name, "max_attempts", attempts, "use a whole number, 1 or more")
    payload = options["payload"]
    options["payload"] = check_payload(name, {} if payload is None else payload)
    options["requires"] = frozenset(options["requires"] or ())
    options["backoff"] = dict(options["backoff"] or {})
    Backoff.from_dict(name, options["backoff"])
    _check_policies(name, options)
    return Job(name=name, func=func, schedule=schedule, **options)


def _check_policies(name: str, options: dict[str, Any]) -> None:
    _check_choice(name, "executor", options["executor"], EXECUTORS)
    for key in ("breaker_threshold", "max_concurrency"):
        value = options[key]
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ImproperlyDeclared(name, key, value, "use a whole number, 1 or more, or None")
    if options["catch_up_limit"] < 1:
        raise ImproperlyDeclared(name, "catch_up_limit", options["catch_up_limit"], "use 1 or more")
    for key in ("timeout", "breaker_cooldown", "catch_up_window"):
        value = options[key]
        if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
            raise ImproperlyDeclared(name, key, value, "use a positive datetime.timedelta")
    if options["breaker_threshold"] and options["breaker_cooldown"] is None:
        options["breaker_cooldown"] = timedelta(minutes=5)
    retry_never = tuple(options["dont_retry"] or ())
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in retry_never):
        raise ImproperlyDeclared(name, "dont_retry", retry_never, "list exception classes")
    options["dont_retry"] = retry_never


@overload
def job(func: Callable[..., Any], /) -> Job: ...
@overload
def job(
    *,
    name: str | None = None,
    cron: str | None = None,
    tz: str | None = None,
    every: timedelta | None = None,
    delay: timedelta | None = None,
    startup: bool = False,
    schedule: schedules.Schedule | None = None,
    placement: str = "cluster",
    delivery: str = "at_least_once",
    overlap: str = "skip",
    misfire: str = "fire_once",
    catch_up_window: timedelta | None = None,
    catch_up_limit: int = 10,
    max_attempts: int = 1,
    backoff: dict | None = None,
    dont_retry: tuple[type[BaseException], ...] = (),
    breaker_threshold: int | None = None,
    breaker_cooldown: timedelta | None = None,
    timeout: timedelta | None = None,
    executor: str = "thread",
    priority: int = 0,
    queue: str = "default",
    max_concurrency: int | None = None,
    requires: set[str] | frozenset[str] | None = None,
    payload: dict | None = None,
    enabled: bool = True,
) -> Callable[[Callable[..., Any]], Job]: ...
def job(func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Declare a job; use bare (on demand) or with a schedule and policies."""
    defaults: dict[str, Any] = {
        "name": None,
        "cron": None,
        "tz": None,
        "every": None,
        "delay": None,
        "startup": False,
        "schedule": None,
        "placement": "cluster",
        "delivery": "at_least_once",
        "overlap": "skip",
        "misfire": "fire_once",
        "catch_up_window": None,
        "catch_up_limit": 10,
        "max_attempts": 1,
        "backoff": None,
        "dont_retry": (),
        "breaker_threshold": None,
        "breaker_cooldown": None,
        "timeout": None,
        "executor": "thread",
        "priority": 0,
        "queue": "default",
        "max_concurrency": None,
        "requires": None,
        "payload": None,
        "enabled": True,
    }
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(
            f"job() got unknown option(s) {', '.join(unknown)}; valid: {', '.join(defaults)}"
        )

    def decorate(function: Callable[..., Any]) -> Job:
        return registry.register(_build(function, {**defaults, **options}))

    return decorate(func) if func is not None else decorate


def with_options(declared: Job, **changes: Any) -> Job:
    """Return a copy of a declared job with some fields changed (for tests and database jobs)."""
    return replace(declared, **changes)

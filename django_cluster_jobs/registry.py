"""The code-declared job set: the ``@job`` decorator and the registry it fills."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
)

from django.apps import apps

from . import bounds, columns, payloads, schedules, validation
from .choices import Delivery, Executor, Misfire, Overlap, Placement
from .context import RunContext
from .exceptions import DuplicateJob, ImproperlyDeclared, RegistryNotReady, UnknownJob
from .run_request import RunRequest

if TYPE_CHECKING:
    from .models import JobRun

#: Options of @job that are JobDefinition columns under the same name.
COLUMN_OPTIONS = (
    "placement", "delivery", "overlap", "misfire", "catch_up_window", "catch_up_limit",
    "max_attempts", "backoff", "breaker_threshold", "breaker_cooldown", "timeout", "executor",
    "priority", "queue", "max_concurrency", "requires", "after", "payload", "enabled",
)  # fmt: skip


P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Job(Generic[P, R]):
    """A declared job: its callable, schedule and policies. Calling it calls the function.

    ``Job[P, R]`` keeps the handler's signature: calling the job is calling the function, with
    the same parameters and return type for callers and type checkers.
    """

    name: str
    func: Callable[P, R]
    schedule: schedules.Schedule
    placement: str = Placement.CLUSTER
    delivery: str = Delivery.AT_LEAST_ONCE
    overlap: str = Overlap.SKIP
    misfire: str = Misfire.FIRE_ONCE
    catch_up_window: timedelta | None = None
    catch_up_limit: int = 10
    max_attempts: int = 1
    backoff: dict[str, Any] = field(default_factory=dict)
    dont_retry: tuple[type[BaseException], ...] = ()
    breaker_threshold: int | None = None
    breaker_cooldown: timedelta | None = None
    timeout: timedelta | None = None
    executor: str = Executor.THREAD
    priority: int = 0
    queue: str = "default"
    max_concurrency: int | None = None
    requires: frozenset[str] = frozenset()
    #: The names of the jobs that must succeed first, within one workflow instance.
    after: tuple[str, ...] = ()
    payload: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    #: True: the handler's first positional argument is the RunContext; False: never; None:
    #: inferred from the first parameter (see :func:`infers_context`).
    takes_context: bool | None = None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    @property
    def origin(self) -> str:
        """Where the job was declared, as module.qualname."""
        return default_name(self.func) or repr(self.func)

    @property
    def wants_context(self) -> bool:
        """True when the handler's first positional argument receives the RunContext."""
        if self.takes_context is None:
            return infers_context(self.func)
        return bool(self.takes_context)

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
            "after": list(self.after),
            "payload": self.payload,
        }

    def enqueue(
        self, *, idempotency_key: str | None = None, priority: int | None = None, **payload: Any
    ) -> JobRun:
        """Run this job once, as soon as a node is free; returns the pending JobRun.

        Keyword arguments become the handler's payload, except two reserved ones: with
        ``idempotency_key`` a second enqueue returns the first run; ``priority`` overrides the
        job's. Call it inside ``transaction.on_commit`` to enqueue only if your data commits.
        """
        from .services import enqueue

        return enqueue(self.name, payload, key=idempotency_key, priority=priority)

    def enqueue_at(
        self,
        when: datetime,
        *,
        idempotency_key: str | None = None,
        priority: int | None = None,
        **payload: Any,
    ) -> JobRun:
        """Run this job once at ``when`` (an aware datetime); returns the pending JobRun."""
        from .services import enqueue

        return enqueue(self.name, payload, at=when, key=idempotency_key, priority=priority)

    def enqueue_many(
        self,
        payloads: Iterable[Mapping[str, Any] | RunRequest],
        *,
        priority: int | None = None,
        at: datetime | None = None,
    ) -> list[JobRun]:
        """Run this job once per payload (or RunRequest), inserted in one statement, all or
        nothing; returns the pending JobRuns in order. ``priority`` and ``at`` apply to the
        items that do not set their own; a RunRequest's ``key`` is its idempotency key."""
        from .bulk import enqueue_many

        return enqueue_many(self.name, payloads, priority=priority, at=at)

    def invoke(self, context: RunContext, payload: dict[str, Any]) -> Any:
        """Call the handler with the context (when it takes one) and the payload as kwargs."""
        handler: Callable[..., Any] = self.func  # the payload's keys are known only at run time
        if self.wants_context:
            return handler(context, **payload)
        return handler(**payload)


def _signature(func: Callable[..., Any]) -> inspect.Signature:
    try:
        return _cached_signature(func)
    except TypeError:  # an unhashable callable, which the cache refuses (or an unreadable one)
        return _read_signature(func)


@lru_cache(maxsize=4096)
def _cached_signature(func: Callable[..., Any]) -> inspect.Signature:
    """The signature, read once per function: code does not change while the process runs."""
    return _read_signature(func)


def _read_signature(func: Callable[..., Any]) -> inspect.Signature:
    # Resolve string annotations (``from __future__ import annotations``) when they can be.
    try:
        return inspect.signature(func, eval_str=True)
    except Exception:
        return inspect.signature(func)


def infers_context(func: Callable[..., Any]) -> bool:
    """The guess made when ``takes_context`` is not given (None).

    The handler receives the RunContext when its first parameter can be passed positionally
    (not ``*args``, not keyword-only) and is either annotated ``RunContext`` (the class, or the
    string ``"RunContext"`` that is left when the annotation cannot be resolved) or named ``ctx``
    or ``context``. Anything else: no context.
    """
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
        #: Functions that find a job declared elsewhere (a django.tasks task) by its name and
        #: register it; asked only for names that are not registered yet.
        self._resolvers: list[Callable[[str], Job | None]] = []

    def add_resolver(self, resolver: Callable[[str], Job | None]) -> None:
        """Ask ``resolver(name)`` for jobs that are not registered (once per resolver)."""
        with self._lock:
            if resolver not in self._resolvers:
                self._resolvers.append(resolver)

    def _resolve(self, name: object) -> Job | None:
        if not isinstance(name, str):
            return None
        for resolver in list(self._resolvers):
            if (found := resolver(name)) is not None:
                return self.register(found)
        return None

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
            if (found := self._resolve(name)) is not None:
                return found
            raise UnknownJob(name, tuple(self._jobs)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._jobs or self._resolve(name) is not None

    def __iter__(self) -> Iterator[Job]:
        return iter(list(self._jobs.values()))

    def names(self) -> list[str]:
        return sorted(self._jobs)

    @staticmethod
    def check_ready() -> None:
        if not apps.ready:
            raise RegistryNotReady


registry = Registry()


def default_name(func: Any) -> str | None:
    """Return ``module.qualname`` of a function, None for a callable that has neither."""
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else None


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
    if given["tz"] is not None and given["cron"] is None:
        raise ImproperlyDeclared(
            job_name, "tz", given["tz"], "tz= applies to cron= only: drop it, or give cron= too"
        )
    if given["schedule"] is not None:
        return _schedule_object(job_name, given["schedule"])
    if given["cron"] is not None:
        return _cron(job_name, given["cron"], given["tz"] or "UTC")
    if given["every"] is not None:
        return schedules.Every(given["every"])
    if given["delay"] is not None:
        return schedules.Delay(given["delay"])
    return schedules.Startup() if given["startup"] else schedules.OnDemand()


def _schedule_object(job_name: str, schedule: Any) -> schedules.Schedule:
    if not isinstance(schedule, schedules.Schedule):
        raise ImproperlyDeclared(job_name, "schedule", schedule, "pass a Schedule object")
    if getattr(schedule, "anchor", None) is not None:
        raise ImproperlyDeclared(
            job_name,
            "schedule",
            schedule,
            "a job's fixed-rate grid is always anchored on CLUSTER_JOBS['EPOCH'], so that "
            "every node computes the same slots; drop anchor= (or change EPOCH)",
        )
    return schedule


def _cron(job_name: str, expr: Any, tz: Any) -> schedules.Cron:
    # Macros, random fields and odd types first: the Cron object knows only field counts.
    hint = columns.RULES["cron"](expr) or columns.cron(expr)
    if hint:
        raise ImproperlyDeclared(job_name, "cron", expr, hint)
    return schedules.Cron(expr, tz)


def check_payload(job_name: str, payload: Any) -> dict[str, Any]:
    """Return ``payload`` as it will be stored (a JSON object); else raise InvalidPayload."""
    return payloads.cleaned(job_name, payload)


def _check_callable(func: Any, job_name: str) -> None:
    if not callable(func):
        hint = "@job decorates a function (def or async def)"
        raise ImproperlyDeclared(job_name, "callable", func, hint)
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        hint = (
            "a generator's body runs only while it is iterated, so the job would never run: "
            "return a value instead of yielding"
        )
        raise ImproperlyDeclared(job_name, "callable", func, hint)


def _name(func: Any, given: Any) -> str:
    default = default_name(func)
    label = given if isinstance(given, str) and given else default or "?"
    _check_callable(func, label)
    if given is None:
        if default is None:
            hint = "this callable has no __qualname__ to name the job after: pass name="
            raise ImproperlyDeclared("?", "name", func, hint)
        return default
    if not isinstance(given, str):
        hint = "pass the job's name as a str, e.g. @job(name='reports.nightly')"
        raise ImproperlyDeclared(label, "name", given, hint)
    return given


def _build(func: Callable[..., Any], options: dict[str, Any]) -> Job:
    name = _name(func, options.pop("name"))
    sched_args = {
        k: options.pop(k) for k in ("cron", "tz", "every", "delay", "startup", "schedule")
    }
    try:
        schedule = _schedule_from(name, **sched_args)
    except ImproperlyDeclared as exc:
        raise ImproperlyDeclared(name, exc.field, exc.value, exc.hint) from None
    _fill_defaults(options)
    options["after"] = predecessor_names(options["after"])
    _check_columns(name, func, schedule, options)
    options["payload"] = payloads.cleaned(name, options["payload"])  # as it will be stored
    options["requires"] = frozenset(options["requires"])
    options["backoff"] = dict(options["backoff"])
    options["dont_retry"] = _dont_retry(name, options["dont_retry"])
    return Job(name=name, func=func, schedule=schedule, **options)


def predecessor_names(given: Any) -> Any:
    """``after=`` as the names it stores: a job object stands for its name. A value that is not
    a list or a tuple is returned as it is, for the validator to refuse."""
    if not isinstance(given, list | tuple):
        return given
    return tuple(item.name if isinstance(item, Job) else item for item in given)


def _fill_defaults(options: dict[str, Any]) -> None:
    for key, empty in (("payload", {}), ("requires", ()), ("backoff", {}), ("after", ())):
        if options[key] is None:
            options[key] = empty
    if options["breaker_threshold"] and options["breaker_cooldown"] is None:
        options["breaker_cooldown"] = bounds.DEFAULT_COOLDOWN


def _check_columns(
    name: str, func: Callable[..., Any], schedule: schedules.Schedule, options: dict[str, Any]
) -> None:
    values = {
        "name": name,
        "callable_name": name,
        "source": "code",
        **schedules.to_fields(schedule),
        **{key: options[key] for key in COLUMN_OPTIONS},
    }
    handler = Job(name=name, func=func, schedule=schedule, takes_context=options["takes_context"])
    problems = validation.definition_errors(values, job=name, handler=handler)
    if problems:
        first = problems[0]
        field = {"timezone": "tz", "interval": schedule.kind}.get(first.field, first.field)
        if first.field == field:
            raise first
        raise ImproperlyDeclared(name, field, first.value, first.hint)


def _dont_retry(name: str, given: Any) -> tuple[type[BaseException], ...]:
    try:
        retry_never = tuple(given or ())
    except TypeError:  # not iterable: refused below like any other value
        retry_never = (given,)
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in retry_never):
        raise ImproperlyDeclared(name, "dont_retry", given, "list exception classes")
    return retry_never


class JobOptions(TypedDict, total=False):
    """The keyword options of :func:`job` other than ``takes_context``, with their types.

    The defaults: :data:`DEFAULTS`; what each means: the declare-jobs how-to.
    """

    name: str | None
    cron: str | None
    tz: str | None
    every: timedelta | None
    delay: timedelta | None
    startup: bool
    schedule: schedules.Schedule | None
    placement: str
    delivery: str
    overlap: str
    misfire: str
    catch_up_window: timedelta | None
    catch_up_limit: int
    max_attempts: int
    backoff: dict[str, Any] | None
    dont_retry: tuple[type[BaseException], ...] | list[type[BaseException]]
    breaker_threshold: int | None
    breaker_cooldown: timedelta | None
    timeout: timedelta | None
    executor: str
    priority: int
    queue: str
    max_concurrency: int | None
    requires: set[str] | frozenset[str] | list[str] | tuple[str, ...] | None
    after: list[Job[..., Any] | str] | tuple[Job[..., Any] | str, ...] | None
    payload: dict[str, Any] | None
    enabled: bool


#: The default of every option of :func:`job`.
DEFAULTS: dict[str, Any] = {
    "name": None,
    "cron": None,
    "tz": None,
    "every": None,
    "delay": None,
    "startup": False,
    "schedule": None,
    "placement": Placement.CLUSTER,
    "delivery": Delivery.AT_LEAST_ONCE,
    "overlap": Overlap.SKIP,
    "misfire": Misfire.FIRE_ONCE,
    "catch_up_window": None,
    "catch_up_limit": 10,
    "max_attempts": 1,
    "backoff": None,
    "dont_retry": (),
    "breaker_threshold": None,
    "breaker_cooldown": None,
    "timeout": None,
    "executor": Executor.THREAD,
    "priority": 0,
    "queue": "default",
    "max_concurrency": None,
    "requires": None,
    "after": None,
    "payload": None,
    "enabled": True,
    "takes_context": None,
}


@overload
def job(func: Callable[P, R], /) -> Job[P, R]: ...
@overload
def job(
    *, takes_context: Literal[True], **options: Unpack[JobOptions]
) -> Callable[[Callable[Concatenate[RunContext, P], R]], Job[Concatenate[RunContext, P], R]]: ...
@overload
def job(
    *, takes_context: Literal[False] | None = None, **options: Unpack[JobOptions]
) -> Callable[[Callable[P, R]], Job[P, R]]: ...
def job(func: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Declare a job; use bare (on demand) or with a schedule and policies.

    ``takes_context``: True, the handler receives the RunContext as its first positional
    argument; False, never; None (the default), inferred by :func:`infers_context`.
    """
    defaults = DEFAULTS
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(
            f"job() got unknown option(s) {', '.join(unknown)}; valid: {', '.join(defaults)}"
        )

    def decorate(function: Callable[..., Any]) -> Job:
        return registry.register(_build(function, {**defaults, **options}))

    if isinstance(func, str):
        return _cron_given_positionally(func)
    return decorate(func) if func is not None else decorate


def _cron_given_positionally(expr: str) -> Callable[[Callable[..., Any]], Job]:
    """Refuse ``@job("0 9 * * *")``, naming the function it decorates."""

    def refuse(function: Callable[..., Any]) -> Job:
        hint = f"pass the cron expression by keyword: @job(cron={expr!r})"
        raise ImproperlyDeclared(default_name(function) or "?", "cron", expr, hint)

    return refuse


def with_options(declared: Job[P, R], **changes: Any) -> Job[P, R]:
    """Return a copy of a declared job with some fields changed (for tests and database jobs)."""
    return replace(declared, **changes)

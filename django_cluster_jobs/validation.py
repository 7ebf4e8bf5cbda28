"""The one validator of a job's definition and of a run's inputs, used at every door.

The doors: the ``@job`` decorator, the admin's job form, the REST API's input serializers, the
services (enqueue, trigger, replay, pause), ``runjob``, the system checks and the node when it
loads stored rows. A problem is an :class:`ImproperlyDeclared` (an :class:`InvalidPayload` for
the payload) naming the job, the field, the value (shortened when huge) and the fix. The bounds
and why they are what they are: :mod:`django_cluster_jobs.bounds`, re-exported here.
"""

from __future__ import annotations

import graphlib
import inspect
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import columns, payloads
from .bounds import (
    BACKOFF_FACTOR_MAX,
    BACKOFF_SECONDS_MAX,
    CATCH_UP_LIMIT_MAX,
    COUNT_MAX,
    CRON_MAX_LENGTH,
    EARLIEST_RUN_AT,
    KEY_MAX_LENGTH,
    LATEST_RUN_AT,
    MAX_ATTEMPTS,
    MAX_COOLDOWN,
    MAX_INTERVAL,
    MAX_TIMEOUT,
    MAX_WINDOW,
    NAME_MAX_LENGTH,
    NAME_PATTERN,
    PAUSE_REASON_MAX_LENGTH,
    PAYLOAD_DEPTH_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_MAX_LENGTH,
    TAG_MAX_LENGTH,
    TAGS_MAX,
    TIMEZONE_MAX_LENGTH,
)
from .choices import SELF_FIRING
from .exceptions import ImproperlyDeclared, InvalidPayload, shown

if TYPE_CHECKING:
    from .models import JobDefinition
    from .registry import Job

__all__ = [
    "BACKOFF_FACTOR_MAX", "BACKOFF_SECONDS_MAX", "CATCH_UP_LIMIT_MAX", "COLUMNS", "COUNT_MAX",
    "CRON_MAX_LENGTH", "EARLIEST_RUN_AT", "KEY_MAX_LENGTH", "LATEST_RUN_AT", "MAX_ATTEMPTS",
    "MAX_COOLDOWN", "MAX_INTERVAL", "MAX_TIMEOUT", "MAX_WINDOW", "NAME_MAX_LENGTH", "NAME_PATTERN",
    "PAUSE_REASON_MAX_LENGTH", "PAYLOAD_DEPTH_MAX", "PRIORITY_MAX", "PRIORITY_MIN",
    "QUEUE_MAX_LENGTH", "TAGS_MAX", "TAG_MAX_LENGTH", "TIMEZONE_MAX_LENGTH", "check_run_inputs",
    "check_task_inputs", "definition_errors", "graph_errors", "is_orphaned",
    "known_names", "missing_predecessors", "registered", "row_errors", "stored_problems",
]  # fmt: skip

#: The JobDefinition columns the validator checks, in the models' order.
COLUMNS = tuple(columns.RULES)
_ORDER = {column: i for i, column in enumerate(COLUMNS)}
_KEY = columns.text(KEY_MAX_LENGTH, blank=True)


def definition_errors(
    values: Mapping[str, Any], *, job: str, handler: Job | None = None
) -> list[ImproperlyDeclared]:
    """Return every problem of the given columns of a job definition; never raise.

    Only the columns in ``values`` are checked (keys that are not columns are ignored); a rule
    across columns (a schedule's interval, a breaker's cooldown) applies when all of its columns
    are given. With ``handler``, the payload is bound to its signature: completely for a job that
    fires on its own, partially for one that runs on demand (each run may add arguments), and
    its ``takes_context`` must fit the handler.
    """
    name = _label(job)
    try:
        if not isinstance(values, Mapping):
            hint = "pass a mapping of column names to values"
            return [ImproperlyDeclared(name, "definition", values, hint)]
        given = {column: values[column] for column in COLUMNS if column in values}
        found = _columns(name, given) + _schedule(name, given) + _after(name, given)
        found += _exactly_once(name, given, handler)
        found += _context(name, handler) or _payload(name, given, handler)
    except Exception as exc:  # a mapping that fails when read: say so, never raise
        return [ImproperlyDeclared(name, "definition", values, f"it cannot be read ({exc!r})")]
    return sorted(found, key=lambda problem: _ORDER.get(problem.field, len(_ORDER)))


def row_errors(definition: JobDefinition) -> list[ImproperlyDeclared]:
    """Return every problem of a stored definition as a node loads it; never raise.

    A callable that is not registered makes the definition orphaned: that problem comes first.
    """
    try:
        values = {column: getattr(definition, column) for column in COLUMNS}
    except Exception as exc:  # a partial object: report it rather than fail the caller
        return [ImproperlyDeclared("?", "definition", definition, f"it cannot be read ({exc!r})")]
    name = _label(values["name"])
    handler = registered(values["callable_name"])
    found = [] if handler else [orphaned(name, values["callable_name"], values["source"])]
    return found + definition_errors(values, job=name, handler=handler) + _marks(name, definition)


#: The columns the scheduler keeps for itself (never an operator's input): what each must hold.
MARKS = {"settled_through": False, "next_to_settle": True, "created_at": False}


def _marks(name: str, definition: JobDefinition) -> list[ImproperlyDeclared]:
    """The scheduler's own times as stored: a raw write can leave one that reads as no time at
    all (SQLite reads text that is no date as None), which no plan can start from."""
    if definition.pk is None:  # not stored yet: the marks are set when it is
        return []
    found = []
    for column, may_be_empty in MARKS.items():
        value = getattr(definition, column, None)
        if value is None and may_be_empty:
            continue
        if not isinstance(value, datetime) or value.utcoffset() is None:
            hint = (
                "the scheduler's own mark is no time (another program wrote what no date reads "
                "as): set it to an aware time with SQL, e.g. the job's creation time"
            )
            found.append(ImproperlyDeclared(name, column, value, hint))
    return found


def check_run_inputs(
    job: str,
    *,
    payload: Any = None,
    priority: Any = None,
    key: Any = None,
    at: Any = None,
    handler: Job | None = None,
) -> dict:
    """Return a run's payload as it will be stored; raise ImproperlyDeclared or InvalidPayload.

    ``priority`` (None: the job's), ``key`` (an idempotency key) and ``at`` (when the run is
    due) are checked when given; with ``handler``, the payload is bound to its signature
    partially (the job's own payload may supply the rest).
    """
    name = _label(job)
    for field, value, rule in (
        ("priority", priority, columns.RULES["priority"]),
        ("key", key, _KEY),
        ("at", at, columns.run_at),
    ):
        hint = None if value is None else _apply(rule, value)
        if hint:
            raise ImproperlyDeclared(name, field, value, hint)
    try:
        cleaned = payloads.cleaned(name, {} if payload is None else payload)
        if handler is not None:
            payloads.bind(name, handler, cleaned, complete=False)
    except InvalidPayload:
        raise
    except Exception as exc:  # an object that fails while it is read
        raise InvalidPayload(name, value=payload, hint=f"it cannot be read ({exc!r})") from None
    return cleaned


def check_task_inputs(
    task: str,
    *,
    args: Any = (),
    kwargs: Any = None,
    priority: Any = 0,
    queue: Any = "default",
    queues: Collection[str] = (),
    at: Any = None,
) -> tuple[list, dict]:
    """Return a ``django.tasks`` run's args and kwargs as they will be stored; raise
    ImproperlyDeclared (InvalidPayload for the arguments) naming the task, the field and the fix.

    ``queues`` are the backend's QUEUES (empty: any queue name); ``at`` is the task's
    ``run_after`` (None: at once).
    """
    name = _label(task)
    for field, value, rule in (
        ("priority", priority, columns.RULES["priority"]),
        ("queue_name", queue, columns.RULES["queue"]),
        ("run_after", at, columns.run_at),
    ):
        if field == "run_after" and value is None:
            continue
        if problem := _apply(rule, value):
            raise ImproperlyDeclared(name, field, value, problem)
    if queues and queue not in queues:
        hint = f"use one of the backend's QUEUES ({', '.join(sorted(queues))}), or add it there"
        raise ImproperlyDeclared(name, "queue_name", queue, hint)
    if not isinstance(args, list | tuple):
        raise InvalidPayload(name, value=args, hint="args must be a list or a tuple")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidPayload(name, value=kwargs, hint=payloads.NOT_A_DICT)
    try:
        cleaned = payloads.cleaned(name, {"args": list(args), "kwargs": kwargs or {}})
    except InvalidPayload:
        raise
    except Exception as exc:  # an object that fails while it is read
        raise InvalidPayload(name, value=args, hint=f"it cannot be read ({exc!r})") from None
    return cleaned["args"], cleaned["kwargs"]


def registered(callable_name: Any) -> Job | None:
    """Return the registered job that runs ``callable_name``, or None."""
    from .registry import registry

    try:
        return registry.get(callable_name) if callable_name in registry else None
    except Exception:  # an unhashable name, or the registry before the apps are ready
        return None


def is_orphaned(definition: JobDefinition) -> bool:
    """True when no registered code runs this stored definition."""
    return registered(getattr(definition, "callable_name", None)) is None


def orphaned(job: str, callable_name: Any, source: Any) -> ImproperlyDeclared:
    """Return the problem of a definition whose callable is not registered."""
    if source == "code":
        hint = (
            f"No job named {shown(callable_name)} is registered: the code that declared this "
            "job was renamed or removed, so the definition is orphaned and no node runs it. "
            "Declare it again with @job, or delete it in the admin (its runs go with it)."
        )
    else:
        hint = (
            f"No job named {shown(callable_name)} is registered, so the definition is orphaned "
            "and no node runs it. Point it at a registered job, or delete it."
        )
    return ImproperlyDeclared(job, "callable_name", callable_name, hint)


def _label(job: Any) -> str:
    return job if isinstance(job, str) else shown(job)


def _apply(rule: columns.Rule, value: Any) -> str | None:
    try:
        return rule(value)
    except Exception as exc:  # a value whose comparison or iteration fails
        return f"it cannot be checked ({exc!r})"


def _columns(name: str, given: dict[str, Any]) -> list[ImproperlyDeclared]:
    found = []
    for column, value in given.items():
        if hint := _apply(columns.RULES[column], value):
            found.append(ImproperlyDeclared(name, column, value, hint))
    return found


def _schedule(name: str, given: dict[str, Any]) -> list[ImproperlyDeclared]:
    kind = given.get("schedule_kind")
    if kind in ("every", "delay") and "interval" in given and given["interval"] is None:
        needs = "this kind of schedule needs an interval (a positive duration)"
        return [ImproperlyDeclared(name, "interval", None, needs)]
    if kind != "cron":
        return []
    found = []
    for column, rule in (("cron", columns.cron), ("timezone", columns.zone)):
        value = given.get(column)
        if column in given and not columns.RULES[column](value) and (hint := _apply(rule, value)):
            found.append(ImproperlyDeclared(name, column, value, hint))
    return found


def _after(name: str, given: dict[str, Any]) -> list[ImproperlyDeclared]:
    """A dependent runs when its predecessors succeeded, never on a schedule of its own; and it
    cannot wait for itself."""
    after, kind = given.get("after"), given.get("schedule_kind", "on_demand")
    if not after or columns.RULES["after"](after):
        return []
    if name in after:
        hint = f"a job cannot wait for itself (cycle {name} -> {name}): remove {name!r} from it"
        return [ImproperlyDeclared(name, "after", after, hint)]
    if kind != "on_demand":
        hint = (
            f"a job that runs after others has no schedule of its own (this one is {kind}): "
            "its root's occurrences start each workflow instance; drop the schedule, or drop "
            "after= and let the job fire on its own"
        )
        return [ImproperlyDeclared(name, "after", after, hint)]
    return []


def graph_errors(
    graph: Mapping[str, Sequence[str]], known: Collection[str]
) -> list[ImproperlyDeclared]:
    """Return every problem of a set of dependencies (job name -> its predecessors' names):
    a predecessor that is not in ``known``, and each cycle, named by its path; never raise."""
    found = [
        ImproperlyDeclared(job, "after", list(after), _unknown(missing))
        for job, after in sorted(graph.items())
        for missing in after
        if missing not in known
    ]
    edges = {job: [p for p in after if p in known] for job, after in graph.items()}
    while cycle := _cycle(edges):
        path = " -> ".join(cycle)
        hint = f"it makes a cycle, {path}: remove one of these dependencies"
        found.append(ImproperlyDeclared(cycle[1], "after", graph[cycle[1]], hint))
        edges[cycle[1]] = [p for p in edges[cycle[1]] if p != cycle[0]]
    return found


def missing_predecessors(
    definition: JobDefinition, known: Collection[str]
) -> list[ImproperlyDeclared]:
    """Return a problem for each predecessor of a stored definition that names no job (one
    deleted in the admin, or removed from the code): the job is never queued after it. ``known``
    holds every declared and stored name (:func:`known_names`); never raise.
    """
    after = definition.after
    if not isinstance(after, list):
        return []  # row_errors reports an after that is not a list
    name = _label(definition.name)
    return [
        ImproperlyDeclared(name, "after", list(after), _unknown(missing))
        for missing in after
        if isinstance(missing, str) and missing not in known
    ]


def known_names(alias: str) -> set[str]:
    """Every job name a predecessor may name: the jobs stored on ``alias`` and the declared."""
    from .models import JobDefinition
    from .registry import registry

    return set(JobDefinition.objects.using(alias).values_list("name", flat=True)) | set(
        registry.names()
    )


def stored_problems(
    definition: JobDefinition, known: Collection[str]
) -> list[ImproperlyDeclared]:
    """Every problem a stored definition shows (in the admin, the API and the status report):
    the validator's and its missing predecessors (``known`` as for missing_predecessors)."""
    return row_errors(definition) + missing_predecessors(definition, known)


def _unknown(name: str) -> str:
    return (
        f"no job named {name!r} is declared or stored: declare it, define it in the admin, or "
        "remove it from after= (a job object, after=[extract], cannot be misspelt)"
    )


def _cycle(edges: Mapping[str, Sequence[str]]) -> list[str]:
    """One cycle of ``edges``, in run order with its first job again at the end; [] if none."""
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def _payload(name: str, given: dict[str, Any], handler: Job | None) -> list[ImproperlyDeclared]:
    if "payload" not in given:
        return []
    try:
        cleaned = payloads.cleaned(name, given["payload"])
        if handler is not None:
            complete = given.get("schedule_kind") in SELF_FIRING
            payloads.bind(name, handler, cleaned, complete=complete)
    except InvalidPayload as exc:
        return [exc]
    return []


def _exactly_once(
    name: str, given: dict[str, Any], handler: Job | None
) -> list[ImproperlyDeclared]:
    """An exactly-once job runs in one transaction with its fenced end, on the node's thread
    and connection: neither in a process of its own nor as a coroutine (whose database calls
    run on other threads, outside that transaction)."""
    if given.get("delivery") != "exactly_once":
        return []
    if given.get("executor") == "process":
        hint = (
            "an exactly-once job runs in one transaction with its fenced end on the node's own "
            "connection, which a process of its own cannot share: use executor='thread', or "
            "delivery='at_least_once' with an idempotent handler"
        )
        return [ImproperlyDeclared(name, "executor", "process", hint)]
    if handler is not None and inspect.iscoroutinefunction(handler.func):
        hint = (
            f"the handler {handler.origin} is async: its database calls run on other threads, "
            "outside the run's transaction; make it a plain def, or use "
            "delivery='at_least_once' with an idempotent handler"
        )
        return [ImproperlyDeclared(name, "delivery", "exactly_once", hint)]
    return []


def _context(name: str, handler: Job | None) -> list[ImproperlyDeclared]:
    """A ``takes_context`` that is not a bool or None, or True for a handler that cannot take it."""
    if handler is None or handler.takes_context is None:
        return []
    value = handler.takes_context
    if not isinstance(value, bool):
        hint = "pass True (the handler takes the RunContext first), False (never) or None (infer)"
        return [ImproperlyDeclared(name, "takes_context", value, hint)]
    if value and not _takes_a_positional(handler):
        hint = (
            f"the handler {handler.origin} has no positional parameter to receive the "
            "RunContext: add one first (def handler(ctx, ...)), or drop takes_context=True"
        )
        return [ImproperlyDeclared(name, "takes_context", value, hint)]
    return []


def _takes_a_positional(handler: Job) -> bool:
    try:
        parameters = inspect.signature(handler.func).parameters.values()
    except (TypeError, ValueError):  # a callable whose signature Python cannot read
        return True
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return any(parameter.kind in positional for parameter in parameters)

"""What the ledger of real scheduler processes must show: the checks the multinode tests share.

The guarantee (docs/explanation/guarantees.md): each occurrence of a scheduled job has one run
row; none ran twice, none was missed. An occurrence that falls while the job's previous run is
still live is recorded ``skipped`` by the overlap policy "skip" (the default), naming that run;
that happens on a loaded machine and is no fault, but only when the run it names did run.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from django_cluster_jobs.ledger import get_ledger
from django_cluster_jobs.models import JobRun, RunState
from django_cluster_jobs.schedules import occurrence_key
from tests.models import Effect
from tests.timing import scaled

#: The reason of an overlap skip (engine/claimer.py, _settle_losers): the live run it names.
OVERLAP_SKIP = re.compile(r"overlap: the previous run is still live \((?P<live>.+)\)\Z")
#: The longest round trip of one statement to the database that a healthy node may take on a
#: loaded 2-core machine (the node, or the server's backend, waiting several scheduler slices
#: for a core): far above the milliseconds it usually takes. Half of it, a node's clock error
#: where it measures its offset, is no less than the 1.5 s the schedule edit test allowed before.
ROUND_TRIP = scaled(3)
#: Every window of a check: all of the job's rows.
WHOLE = ((None, None),)

LEDGER_FIELDS = (
    "key", "state", "outcome", "node", "reason", "scheduled_at", "created_at", "started_at",
    "finished_at",
)  # fmt: skip


def cluster_time_error() -> timedelta:
    """How far a node's cluster time may be off the database's clock.

    Where the database's clock is the host's (SQLite), a node reads it itself: exact. Elsewhere a
    node estimates its offset from one round trip per heartbeat, assuming the server answered
    half-way (engine/clock.py), so it is off by at most half that round trip.
    """
    if get_ledger().vendor.features.clock_is_local:
        return timedelta(0)
    return timedelta(seconds=ROUND_TRIP / 2)


def ledger_of(job: str, **filters: object) -> str:
    """The job's rows, for failure messages."""
    rows = JobRun.objects.filter(job__name=job, **filters).order_by("scheduled_at", "key")
    return "\n".join(" ".join(map(str, row)) for row in rows.values_list(*LEDGER_FIELDS))


def assert_every_occurrence_once(
    job: str,
    *,
    step: timedelta | None = None,
    key_suffix: str = "",
    spans: Iterable[tuple[datetime | None, datetime | None]] = WHOLE,
    least: int = 1,
    least_ran: int | None = None,
    effects_per_run: int = 1,
    context: str = "",
) -> list[datetime]:
    """Assert that each occurrence of ``job`` has exactly one run row, ran at most once, and
    either ran and succeeded or was skipped for a live run that ran; return their instants.

    ``step``: the schedule's step; in each of ``spans`` (after, through], from its first row to
    its last, no occurrence is missing (a fixed-delay, startup or edited schedule has none).
    ``key_suffix``: only the rows whose key ends so (an every-node job: ``@<node id>``).
    ``least``: how many occurrences the window holds at least. ``least_ran``: how many of them
    ran at least; by default at least half of them (see :func:`assert_ran_enough`).
    ``effects_per_run``: how many effects one execution of the handler records.
    """
    runs = JobRun.objects.filter(job__name=job, key__endswith=key_suffix)
    ledger = f"{ledger_of(job, key__endswith=key_suffix)}\n{context}"
    rows: list[JobRun] = []
    for after, through in spans:
        span = runs
        if after is not None:
            span = span.filter(scheduled_at__gt=after)
        if through is not None:
            span = span.filter(scheduled_at__lte=through)
        found = list(span.order_by("scheduled_at"))
        if step is not None:
            assert_contiguous([r.scheduled_at for r in found], step, ledger)
        rows += found
    assert len(rows) >= least, f"{len(rows)} occurrences of {job}, not {least}\n{ledger}"
    if step is not None:  # each row is the occurrence its key names
        wrong = [r.key for r in rows if r.key != occurrence_key(r.scheduled_at) + key_suffix]
        assert not wrong, f"keys that are not their occurrence's: {wrong}\n{ledger}"
    ran = [r for r in rows if r.state != RunState.SKIPPED]
    failed = [(r.key, r.state) for r in ran if r.state != RunState.SUCCEEDED]
    assert not failed, f"runs of {job} that did not succeed: {failed}\n{ledger}"
    assert_executed_once(job, runs, key_suffix, effects_per_run, ledger)
    for skip in (r for r in rows if r.state == RunState.SKIPPED):
        assert_skip_justified(job, skip, ledger)
    assert_ran_enough(len(ran), len(rows), least_ran, ledger)
    return [r.scheduled_at for r in rows]


def assert_contiguous(instants: list[datetime], step: timedelta, ledger: str = "") -> None:
    gaps = [(a, b) for a, b in itertools.pairwise(instants) if b - a != step]
    assert not gaps, f"missed or doubled occurrences between {gaps}\n{ledger}"


def assert_executed_once(
    job: str, runs, key_suffix: str, effects_per_run: int, ledger: str
) -> None:
    """Each run of ``runs`` that ran executed its handler once, on the node that claimed it;
    nothing else of the job whose key ends with ``key_suffix`` (a skipped occurrence, another
    attempt) executed."""
    ran = runs.exclude(state=RunState.SKIPPED).values_list("key", "node")
    expected = {(key, node): effects_per_run for key, node in ran}
    keys = runs.values_list("key", flat=True)
    effects = Effect.objects.filter(job=job, key__in=list(keys)).values_list("key", "node")
    executed = Counter(effects)
    assert executed == expected, f"executions of {job} per (key, node): {executed}\n{ledger}"
    strays = Effect.objects.filter(job=job, key__endswith=key_suffix).exclude(key__in=list(keys))
    assert not strays.exists(), f"executions of {job} with no run row: {list(strays)}\n{ledger}"


def assert_skip_justified(job: str, skip: JobRun, ledger: str) -> None:
    """A skipped occurrence is an overlap skip naming the live run that held the job's lane: a
    run of the same job, of an earlier occurrence, that ran (and so was live when it fell)."""
    named = OVERLAP_SKIP.match(skip.reason)
    assert named, f"{job} @ {skip.key} skipped for no overlap: {skip.reason!r}\n{ledger}"
    live = JobRun.objects.filter(job__name=job, key=named["live"]).first()
    assert live is not None, f"{skip.key} names a run that does not exist\n{ledger}"
    assert live.scheduled_at < skip.scheduled_at, f"{skip.key} names a later run\n{ledger}"
    assert live.state == RunState.SUCCEEDED, f"{skip.key} names a run that did not run\n{ledger}"


def assert_ran_enough(ran: int, occurrences: int, least_ran: int | None, ledger: str) -> None:
    """Enough occurrences ran that the skips cannot be the rule.

    That every skip names a run that ran cannot show that run was still live when the skip was
    decided: its end and the skip's decision are instants of two nodes' clocks, and the end is
    written back with a latency a loaded machine does not bound. So a lane left held by a run
    that ended would pass that check; this one fails it. A test job's run is one insert, live
    for milliseconds; the next occurrence is skipped only if the run is still live a second
    after its own occurrence. If fewer than half the occurrences ran, the runs lived a second or
    more on average, a hundred times their healthy length: a cluster that slow is not healthy,
    however loaded the machine (the suite's deadlines allow ten to twenty times the usual).
    """
    least = least_ran if least_ran is not None else (occurrences + 1) // 2
    assert ran >= least, f"{ran} of {occurrences} occurrences ran, not at least {least}\n{ledger}"

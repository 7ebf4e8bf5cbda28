"""Prometheus metrics of one node, fed by our own signals: the ``metrics`` extra.

Nothing here is imported by the engine: :class:`NodeMetrics` connects receivers to the lifecycle
signals (django_cluster_jobs.signals), to ``post_save`` of the cluster event rows,
and reads the node's in-memory counters when scraped. Without ``prometheus-client`` installed,
:func:`for_node` returns None and nothing is recorded.

Every run's outcome is concluded, and its signal sent, by the node process itself, also for the
process executor (the child only runs the handler and sends its result back through a pipe), so
the parent records everything in its own registry: no multiprocess mode is needed.

Cluster-wide gauges (queue depth, oldest pending age, dead letters) are read from the database
by the leader only, at scrape time, so a sum over pods is not N times the truth.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from django.db import DatabaseError, connections
from django.db.models.signals import post_save

from .. import signals
from ..models import ClusterEvent, ClusterEventKind
from ..status import backlog, dead_letters
from ..stored import unreadable_seen

if TYPE_CHECKING:
    from datetime import datetime, timedelta

try:
    import prometheus_client
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError:  # the extra is not installed: for_node() returns None
    prometheus_client = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

#: Seconds: from a few milliseconds late to a missed minute, and from a quick handler to an hour.
LAG_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, float("inf"))
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, float("inf"))
RUN_LABELS = ("job", "queue")
#: The cluster events that change this node's leadership, and the label each counts under.
LEADERSHIP: dict[str, str] = {
    ClusterEventKind.LEADER_ACQUIRED: "acquired",
    ClusterEventKind.LEADER_LOST: "lost",
}


class MetricsHost(Protocol):
    """What the metrics read from the node (engine.node.Node)."""

    node_id: str
    counters: Any
    clock: Any
    leader: Any
    heartbeat: Any
    ledger: Any

    @property
    def planned(self) -> dict[str, Any]: ...


def available() -> bool:
    """Whether prometheus-client is installed."""
    return prometheus_client is not None


def for_node(node: MetricsHost) -> NodeMetrics | None:
    """Metrics of ``node``, connected to the signals; None without prometheus-client."""
    if not available():
        return None
    metrics = NodeMetrics(node)
    metrics.connect()
    return metrics


class NodeMetrics:
    """One node's registry: counters and histograms fed by signals, gauges read when scraped."""

    def __init__(self, node: MetricsHost) -> None:
        self.node = node
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        self._started: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()
        self._define()
        self.registry.register(_NodeCollector(node))

    def _define(self) -> None:
        p, r = prometheus_client, self.registry
        self.runs = p.Counter("cluster_jobs_runs", "Attempts that ended on this node, by "
                              "outcome.", (*RUN_LABELS, "outcome"), registry=r)  # fmt: skip
        self.dead = p.Counter("cluster_jobs_runs_dead_lettered", "Runs this node dead-lettered.",
                              RUN_LABELS, registry=r)  # fmt: skip
        self.missed = p.Counter("cluster_jobs_occurrences_missed", "Occurrences this node, as "
                                "leader, recorded missed.", ("job",), registry=r)  # fmt: skip
        self.lost = p.Counter("cluster_jobs_runs_lost", "Runs recorded lost (at-most-once) by "
                              "this node.", ("job",), registry=r)  # fmt: skip
        self.fenced = p.Counter("cluster_jobs_fenced_out_writes", "Write-backs of this node "
                                "refused by a newer fence.", (), registry=r)  # fmt: skip
        self.takeovers = p.Counter("cluster_jobs_lease_takeovers", "Runs this node took from "
                                   "an owner that went away, by cause.", ("job", "cause"),
                                   registry=r)  # fmt: skip
        self.leadership = p.Counter("cluster_jobs_leadership_changes", "Times this node "
                                    "became or stopped being leader.", ("change",),
                                    registry=r)  # fmt: skip
        self.lag = p.Histogram("cluster_jobs_firing_lag_seconds", "From an occurrence's due "
                               "time to its handler's start (first attempts).", RUN_LABELS,
                               buckets=LAG_BUCKETS, registry=r)  # fmt: skip
        self.duration = p.Histogram("cluster_jobs_run_duration_seconds", "From a handler's "
                                    "start to its recorded end.", (*RUN_LABELS, "outcome"),
                                    buckets=DURATION_BUCKETS, registry=r)  # fmt: skip

    # -- wiring -------------------------------------------------------------------------------

    def _receivers(self) -> list[tuple[Any, Any, Any]]:
        return [
            (signals.run_started, self._on_started, None),
            (signals.run_succeeded, self._on_succeeded, None),
            (signals.run_failed, self._on_failed, None),
            (signals.run_dead_lettered, self._on_dead, None),
            (signals.run_missed, self._on_missed, None),
            (signals.run_lost, self._on_lost, None),
            (signals.run_taken_over, self._on_taken_over, None),
            (signals.run_fenced_out, self._on_fenced_out, None),
            (post_save, self._on_cluster_event, ClusterEvent),
        ]

    def connect(self) -> None:
        for signal, receiver, sender in self._receivers():
            signal.connect(receiver, sender=sender, weak=False, dispatch_uid=self._uid(receiver))

    def disconnect(self) -> None:
        for signal, receiver, sender in self._receivers():
            signal.disconnect(sender=sender, dispatch_uid=self._uid(receiver))

    def _uid(self, receiver: Any) -> str:
        return f"cluster_jobs.metrics.{id(self)}.{receiver.__name__}"

    def exposition(self) -> tuple[bytes, str]:
        """The text format of every metric, for /metrics."""
        text = prometheus_client.generate_latest(self.registry)
        return text, prometheus_client.CONTENT_TYPE_LATEST

    # -- receivers ----------------------------------------------------------------------------

    def _mine(self, node: str) -> bool:
        return node == self.node.node_id

    def _queue(self, job: str) -> str:
        planned = self.node.planned.get(job)
        return planned.definition.queue if planned is not None else ""

    def _on_started(self, sender: str, *, run_id: int, node: str, attempt: int,
                    scheduled_at: datetime | None = None, **_: Any) -> None:  # fmt: skip
        if not self._mine(node):
            return
        with self._lock:
            self._started[(run_id, attempt)] = time.monotonic()
        if attempt == 1 and scheduled_at is not None:
            lag: timedelta = self.node.clock.now() - scheduled_at
            self.lag.labels(sender, self._queue(sender)).observe(max(0.0, lag.total_seconds()))

    def _ended(self, job: str, run_id: int, attempt: int, outcome: str) -> None:
        queue = self._queue(job)
        self.runs.labels(job, queue, outcome).inc()
        with self._lock:
            began = self._started.pop((run_id, attempt), None)
        if began is not None:
            self.duration.labels(job, queue, outcome).observe(time.monotonic() - began)

    def _on_succeeded(self, sender: str, *, run_id: int, node: str, attempt: int,
                      **_: Any) -> None:  # fmt: skip
        if self._mine(node):
            self._ended(sender, run_id, attempt, "succeeded")

    def _on_failed(self, sender: str, *, run_id: int, node: str, attempt: int, state: str,
                   will_retry: bool, **_: Any) -> None:  # fmt: skip
        if self._mine(node):
            self._ended(sender, run_id, attempt, "retried" if will_retry else state)

    def _on_dead(self, sender: str, *, node: str, **_: Any) -> None:
        if self._mine(node):
            self.dead.labels(sender, self._queue(sender)).inc()

    def _on_missed(self, sender: str, *, node: str, **_: Any) -> None:
        if self._mine(node):
            self.missed.labels(sender).inc()

    def _on_lost(self, sender: str, *, node: str, **_: Any) -> None:
        if self._mine(node):
            self.lost.labels(sender).inc()

    def _on_taken_over(self, sender: str, *, node: str, cause: str, **_: Any) -> None:
        if self._mine(node):
            self.takeovers.labels(sender, cause).inc()

    def _on_fenced_out(self, sender: str, *, node: str, **_: Any) -> None:
        # From the runner, not the fenced_out row: PostgreSQL writes that row in SQL, unseen
        # by post_save.
        if self._mine(node):
            self.fenced.inc()

    def _on_cluster_event(self, sender: Any, *, instance: ClusterEvent, created: bool,
                          **_: Any) -> None:  # fmt: skip
        change = LEADERSHIP.get(instance.kind)
        if created and change is not None and self._mine(instance.node):
            self.leadership.labels(change).inc()


class _NodeCollector:
    """What is read when scraped: the node's claim tallies, its leadership, heartbeat and clock;
    and, on the leader only, the cluster's backlog and dead letters from the database."""

    def __init__(self, node: MetricsHost) -> None:
        self.node = node

    def describe(self) -> list:
        return []  # families depend on the state; nothing to check against at registration

    def collect(self) -> Iterator[Any]:
        node, labels = self.node, [self.node.node_id]
        stats = node.counters.snapshot(0.0)
        yield _counter("cluster_jobs_occurrences_claimed", "Occurrences this node claimed.",
                       stats.claims_won, ["node"], labels)  # fmt: skip
        yield _counter("cluster_jobs_occurrences_lost", "Occurrences another node claimed "
                       "first.", stats.claims_lost, ["node"], labels)  # fmt: skip
        skipped = CounterMetricFamily("cluster_jobs_occurrences_skipped", "Occurrences this node "
                                      "skipped, by reason.", labels=["node", "reason"])  # fmt: skip
        for reason, n in sorted(stats.skipped.items()):
            skipped.add_metric([node.node_id, reason], n)
        yield skipped
        leading = getattr(node.leader, "held", None) is not None
        yield _gauge("cluster_jobs_leader", "1 while this node holds the leader lease.",
                     float(leading), ["node"], labels)  # fmt: skip
        yield _gauge("cluster_jobs_clock_offset_seconds", "The database's clock minus this "
                     "node's.", node.clock.offset.total_seconds(), ["node"], labels)  # fmt: skip
        last_ok = getattr(node.heartbeat, "last_ok", None)
        if last_ok is not None:
            yield _gauge("cluster_jobs_heartbeat_age_seconds", "Seconds since this node's last "
                         "successful heartbeat.", time.monotonic() - last_ok, ["node"],
                         labels)  # fmt: skip
        unreadable = GaugeMetricFamily(
            "cluster_jobs_unreadable_rows",
            "Stored rows this process met that a value in them makes unreadable, by table.",
            labels=["table"],
        )
        for table, n in sorted(unreadable_seen().items()):
            unreadable.add_metric([table], n)
        yield unreadable
        if leading:
            yield from _cluster_gauges(node)


def _counter(name: str, doc: str, value: float, names: list[str], labels: list[str]) -> Any:
    family = CounterMetricFamily(name, doc, labels=names)
    family.add_metric(labels, value)
    return family


def _gauge(name: str, doc: str, value: float, names: list[str], labels: list[str]) -> Any:
    family = GaugeMetricFamily(name, doc, labels=names)
    family.add_metric(labels, value)
    return family


def _cluster_gauges(node: MetricsHost) -> Iterator[Any]:
    """The leader's cluster-wide gauges; nothing when the database does not answer."""
    alias = node.ledger.alias
    try:
        queues, letters = backlog(alias, node.clock.now()), dead_letters(alias)
    except DatabaseError as exc:
        logger.warning("metrics: could not read the cluster's backlog: %s", exc)
        return
    finally:
        connections.close_all()  # each scrape is served on a thread of its own
    depth = GaugeMetricFamily("cluster_jobs_queue_depth", "Pending runs due now, by queue "
                              "(from the leader).", labels=["queue"])  # fmt: skip
    oldest = GaugeMetricFamily("cluster_jobs_queue_oldest_pending_age_seconds", "Age of the "
                               "oldest due pending run, by queue (from the leader).",
                               labels=["queue"])  # fmt: skip
    for queue, (count, age) in sorted(queues.items()):
        depth.add_metric([queue], count)
        oldest.add_metric([queue], age)
    dead = GaugeMetricFamily("cluster_jobs_dead_letters", "Dead-lettered runs in the "
                             "ledger, by job (from the leader).", labels=["job"])  # fmt: skip
    for job, count in sorted(letters.items()):
        dead.add_metric([job], count)
    yield from (depth, oldest, dead)

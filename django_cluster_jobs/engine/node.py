"""The node: one ``runscheduler`` process's lifecycle and loop, made of parts.

The claimer plans the jobs and claims their occurrences, the taker starts due pending runs, the
runner executes what was won on the executor's threads; the heartbeat and the leader each run on
a thread of their own, supervised by the loop, and so does the pending listener (PostgreSQL's
LISTEN, SQLite's wake file), without which the node polls. Each part receives the node as the
narrow protocol of what it uses (engine.protocols).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError
from django.utils.module_loading import import_string

from ..conf import app_settings
from ..coordination import Heartbeat, Peer, Won
from ..coordination.types import LeaderRenewal
from ..ledger import Ledger, get_ledger
from ..models import NodeStatus, RunState
from ..observe import tracing
from ..registry import Registry, registry
from . import stats
from .claimer import Claimer
from .clock import Clock
from .executor import Executor, release_broken_connections
from .handlers import merged_payload, safe_text
from .health import NodeHealth
from .heartbeat import HeartbeatThread
from .leader import Leader, LeaderThread
from .periodic import PeriodicThread
from .planner import Definitions, Planned
from .presence import LocalPresence, SessionPresence, process_alive, process_token
from .registration import previous_registration, register, set_status, sync_definitions
from .runner import Runner
from .taker import Taker

if TYPE_CHECKING:
    from .listener import FileListener, PendingListener

logger = logging.getLogger(__name__)

#: The longest the loop sleeps without a reason to wake.
MAX_SLEEP = 60.0
#: Restarts of a background thread that died before the node gives up and stops.
MAX_RESTARTS = 3
#: Seconds the loop pauses after a tick failed unexpectedly, so a failure cannot spin it.
TICK_BACKOFF = 1.0


def default_clock() -> Clock:
    """The clock named by CLUSTER_JOBS['CLOCK'] (tests inject skewed ones), else the real one."""
    return import_string(app_settings.CLOCK)() if app_settings.CLOCK else Clock()


class Node:
    """One ``runscheduler`` process; drive it with :meth:`run` (tests pass ``max_ticks``).

    The constructor starts nothing: :meth:`start` registers the node and starts its threads.
    """

    def __init__(
        self,
        node_id: str | None = None,
        *,
        clock: Clock | None = None,
        ledger: Ledger | None = None,
        threads: int | None = None,
        tags: frozenset[str] | None = None,
        jobs: Registry = registry,
    ) -> None:
        self.node_id = node_id or app_settings.node_id()
        self.clock = clock or default_clock()
        self.ledger = ledger or get_ledger()
        self.tags = frozenset(app_settings.NODE_TAGS if tags is None else tags)
        self.registry = jobs
        self.executor = Executor(threads or app_settings.EXECUTOR_THREADS)
        self.runner = Runner(self.ledger, self.clock, self.node_id)
        self.counters = stats.Counters()
        self.claimer = Claimer(self)
        self.taker = Taker(self)
        self.wake = threading.Event()
        #: The live nodes' ids, as the last heartbeat read them (empty before the first).
        self._live: tuple[str, ...] = ()
        self.ticks = 0
        self.heartbeat = HeartbeatThread(self)
        self.leader = Leader(self)
        self.leader_thread = LeaderThread(self.leader)
        self.listener = self._make_listener()
        self.presence = self._make_presence()
        #: This registration's process identity (WorkerNode.process).
        self.process = process_token()
        #: How often each background thread (by name) was restarted after it died.
        self.restarts: Counter[str] = Counter()
        #: Why the node stopped on its own (the command exits non-zero), "" otherwise.
        self.failure = ""
        self._stopping = threading.Event()
        self._reload = threading.Event()
        #: What the loop's next reload covers: every job (after a failed tick), or the changed
        #: definitions and these jobs.
        self._reload_all = False
        self._reload_jobs: set[str] = set()
        self.definitions = Definitions(self.ledger.alias, self.registry)
        self._registered = time.monotonic()
        #: What the probes read (observe.probes), stamped by the loop and the lifecycle.
        self.health = NodeHealth(self)

    def _make_listener(self) -> PendingListener | FileListener | None:
        from .listener import FileListener, PendingListener

        vendor = self.ledger.vendor
        if vendor.features.listens:
            return PendingListener(self.ledger.alias, self.node_id, self.taker.notified)
        path = vendor.wake_path()
        return None if path is None else FileListener(path, self.node_id, self.taker.wake)

    def _make_presence(self) -> SessionPresence | LocalPresence | None:
        features = self.ledger.vendor.features
        if not app_settings.PRESENCE:
            return None
        if features.session_locks:
            return SessionPresence(
                self.ledger.alias,
                self.node_id,
                self._node_lost,
                self._presence_lost,
                self._presence_regained,
            )
        if features.clock_is_local:
            return LocalPresence(self.node_id, self._node_lost)
        return None

    # -- what the parts see (engine.protocols) ------------------------------------------------

    @property
    def log_extra(self) -> dict[str, str]:
        return {"node": self.node_id}

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def listening(self) -> bool:
        """True while the listener hears of new runs: a dead or stopped one does not, and the
        node polls again."""
        listener = self.listener
        return listener is not None and listener.healthy and listener.is_alive()

    def look_every(self) -> float | None:
        """Seconds between two looks for pending runs nothing announced: the poll interval
        while nothing announces them, a safety poll where an announcement can fail (the wake
        file), None where none can (a healthy LISTEN)."""
        if self.listener is None or not self.listening:
            return app_settings.POLL_INTERVAL
        polls = self.listener.safety_polls
        return None if polls is None else polls * app_settings.POLL_INTERVAL

    @property
    def planned(self) -> dict[str, Planned]:
        return self.claimer.planned

    def free_threads(self) -> int:
        return self.executor.free

    @property
    def threads(self) -> int:
        return self.executor.threads

    @property
    def live_nodes(self) -> Sequence[str]:
        return self._live

    def job_names(self) -> list[str]:
        return self.registry.names()

    def request_reload(self, jobs: Collection[str] = ()) -> None:
        """Re-plan at the next tick the definitions that changed, and ``jobs``."""
        self._reload_jobs.update(jobs)
        self._reload.set()
        self.wake.set()

    def leader_renewal(self, now: datetime) -> LeaderRenewal | None:
        return self.leader.renewal(now)

    def leader_observed(
        self, beat: Heartbeat, now: datetime, renewal: LeaderRenewal | None
    ) -> None:
        """What a heartbeat saw, for the leader: its thread wakes when there is work."""
        if self.leader.observe(beat, now, renewal):
            self.leader_thread.poke()

    def peers_seen(self, peers: Sequence[Peer]) -> None:
        """The live nodes the heartbeat read: presence watches them, and the taker counts on
        them to know which notifications are for this node (engine.wakeups)."""
        self._live = tuple(sorted(peer.node_id for peer in peers))
        if self.presence is not None:
            self.presence.observe(peers)

    def _node_lost(self, peer: Peer, how: str) -> None:
        """A peer's process ended (presence saw it): release its runs now, not at lease expiry."""
        now = self.clock.now()
        released = self.ledger.chores.node_lost(peer.node_id, peer.process, self.node_id, now, how)
        if released is None:
            return  # it registered again meanwhile: its runs are its new process's
        logger.warning("node %s ended (%s): released %d run(s)", peer.node_id, how, released,
                       extra=self.log_extra)  # fmt: skip
        self.leader_thread.poke()  # a leader lease it held is free now
        self.taker.wake()

    def _presence_regained(self) -> None:
        """This node holds its presence lock again after losing it: it registers a new process
        identity, so peers that took it for dead watch it again."""
        self.process = process_token()
        set_status(self.ledger.alias, self.node_id, process=self.process)

    def _presence_lost(self) -> None:
        """This node's presence session ended: a peer may release its runs; the heartbeat, at
        once, cancels the handlers of those that are no longer this node's."""
        self.heartbeat.poke()

    def request_stop(self, reason: str = "signal") -> None:
        """Stop claiming at once; the loop then drains. Safe from signal handlers and threads."""
        if not self._stopping.is_set():
            logger.info("node %s stopping (%s)", self.node_id, reason, extra=self.log_extra)
        self._stopping.set()
        self.wake.set()

    # -- lifecycle ----------------------------------------------------------------------------

    def run(self, *, max_ticks: int | None = None, duration: float | None = None) -> None:
        """Start, loop until stopped (or ``max_ticks`` / ``duration``), then drain and stop."""
        self.start()
        timer = threading.Timer(duration or 0, self.request_stop, kwargs={"reason": "duration"})
        timer.daemon = True
        if duration is not None:
            timer.start()
        try:
            while not self._stopping.is_set():
                self.tick()
                if max_ticks is not None and self.ticks >= max_ticks:
                    break
                self._sleep()
        finally:
            timer.cancel()
            self.stop()

    def start(self) -> None:
        """Copy the code registry to the database, register, beat once, start the threads.

        What may be slow comes before the registration (copying many definitions) or after the
        threads start (the leader's first chores, on its own thread): the node plans from the
        moment it registered, and its first tick follows at once, so it never claims an
        occurrence late while a node that started after it claims the next one.
        """
        began = time.monotonic()
        sync_definitions(self.registry, self.ledger.alias)
        self._take_presence()
        pk = self.register()
        # The node exists from the moment it began to start: an occurrence that falls while it
        # copies its definitions (slow on a loaded host) is its to fire, not a missed one.
        self._registered = began
        if self.presence is not None and self.presence.own is None:
            self.presence.hold(pk)  # the first registration of this node id
        # The clock first: the node's start and its first plan are instants in cluster time.
        self.heartbeat.measure()
        self._mark_started()
        self.heartbeat.prime()
        self.reload()
        self.heartbeat.beat()
        self.executor.start()
        for thread in self._threads():
            thread.start()
        if self.presence is not None:
            self.presence.start()
        self.taker.wake()
        self.claimer.fire_startup_jobs(self.clock.now())
        self.health.mark_started()
        logger.info("node %s started with %d job(s)", self.node_id, len(self.planned),
                    extra=self.log_extra)  # fmt: skip

    def stop(self) -> None:
        """Drain: finish running handlers within the grace period, hand back the rest, stop."""
        self._stopping.set()
        self._set_status(NodeStatus.DRAINING)
        if not self.executor.wait_idle(app_settings.GRACE_PERIOD):
            self.hand_back_running()
        for thread in self._threads():
            thread.stop(timeout=app_settings.HEARTBEAT_INTERVAL + 5)
        try:
            self.leader.resign()
        except DatabaseError:
            logger.warning("could not resign leadership", exc_info=True, extra=self.log_extra)
        self.executor.shutdown()
        self._set_status(NodeStatus.STOPPED, stopped=True)
        if self.presence is not None:  # last: a peer must not take a stopping node for dead
            self.presence.stop(timeout=app_settings.HEARTBEAT_INTERVAL + 5)
        release_broken_connections()
        logger.info("node %s stopped", self.node_id, extra=self.log_extra)

    def _threads(self) -> list[PeriodicThread]:
        threads: list[PeriodicThread] = [self.heartbeat, self.leader_thread]
        return threads + ([self.listener] if self.listener is not None else [])

    def hand_back_running(self) -> None:
        """Cancel the handlers still running and release their runs for another node at once."""
        active = self.runner.snapshot()
        logger.warning("grace period over with %d run(s) still going; handing them back",
                       len(active), extra=self.log_extra)  # fmt: skip
        self.runner.cancel()
        now = self.clock.now()
        for run in active:
            try:
                state = self.ledger.runs.hand_back(run.won, self.node_id, now)
            except DatabaseError as exc:
                logger.warning("could not hand back %s @ %s: %s; its lease will expire",
                               run.planned.name, run.won.key, exc,
                               extra=self.log_extra)  # fmt: skip
                continue
            logger.warning("handed back %s @ %s: now %s", run.planned.name, run.won.key,
                           state or "owned by another node", extra=self.log_extra)  # fmt: skip

    def register(self) -> int:
        """Record this node as active (waiting out a busy database); return its row's id."""
        self._registered = time.monotonic()
        return register(self.ledger.alias, self.node_id, self.tags, self.clock.now(), self.process)

    def _take_presence(self) -> None:
        """Take this node id's presence, then release what its previous process left running
        when that process is known to be gone: on PostgreSQL once this node holds the id's
        presence lock, on SQLite when that process no longer runs on this host."""
        presence = self.presence
        if presence is None:
            return
        previous = previous_registration(self.ledger.alias, self.node_id)
        if previous is None:
            return
        pk, process = previous
        held = presence.hold(pk) and isinstance(presence, SessionPresence)
        if process and (held or process_alive(process) is False):
            how = "a new process registered with its id; the previous one ended"
            self.ledger.chores.node_lost(self.node_id, process, self.node_id, self.clock.now(), how)

    def _mark_started(self) -> None:
        """Plan from the moment this node began to start, in cluster time, and store that moment.

        The leader's catch-up leaves every occurrence after a live node's ``started_at`` to the
        nodes, so the first plan must collect everything after it, including what falls due while
        the node copies and loads its definitions; the stored start (written at registration, on
        this node's own clock) is corrected to it.
        """
        started = self.clock.now() - timedelta(seconds=time.monotonic() - self._registered)
        self.claimer.started_at = started
        set_status(self.ledger.alias, self.node_id, started_at=started, last_heartbeat=started)

    def _set_status(self, status: str, *, stopped: bool = False) -> None:
        offset_ms = self.clock.offset.total_seconds() * 1000
        fields: dict[str, object] = {"status": status, **self.counters.snapshot(offset_ms).fields()}
        if stopped:
            fields["stopped_at"] = self.clock.now()
        set_status(self.ledger.alias, self.node_id, **fields)

    # -- the loop -----------------------------------------------------------------------------

    def reload(self, *, everything: bool = True) -> None:
        """Reload definitions from the database and re-plan the jobs this node can run: every
        one, or with ``everything`` False only those whose definition changed since the last
        load (and those a claim asked for)."""
        if everything:
            loaded = self.definitions.load()
            here = {n: p for n, p in loaded.items() if p.runs_here(self.tags)}
            self.claimer.replan(here, self.clock.now())
            self._reload_all = False
        else:
            changes = self.definitions.changes(also=set(self._reload_jobs))
            here = {n: p for n, p in changes.planned.items() if p.runs_here(self.tags)}
            dropped = changes.dropped | (changes.planned.keys() - here.keys())
            self.claimer.replan_changed(here, dropped, self.clock.now())
        self._reload_jobs.clear()
        self.health.mark_loaded()

    def tick(self) -> None:
        """Claim every occurrence due now, in one batch; then start due pending runs.

        A database error anywhere in a tick is logged and the loop goes on: what could not be
        claimed was skipped (fail-closed), and a reload that failed is tried again next tick.
        """
        self.ticks += 1
        self.health.mark_ticking()
        self._supervise()
        try:
            if self._reload.is_set():
                self.reload(everything=self._reload_all)
                self._reload.clear()
            now = self.clock.now()
            with tracing.claim_span(self.node_id, self.counters):
                self.claimer.tick(now)
            self.taker.tick(self.claimer.by_pk, now)
        except DatabaseError as exc:
            release_broken_connections()
            logger.warning("tick of %s failed (fail-closed, retrying next tick): %s",
                           self.node_id, exc, extra=self.log_extra)  # fmt: skip
        except Exception:  # a last resort: each job and run is contained where it is handled
            logger.exception("tick of %s failed; re-planning every job", self.node_id,
                             extra=self.log_extra)  # fmt: skip
            self._reload_all = True  # what this tick popped from the plan is planned again
            self.request_reload()
            self._stopping.wait(TICK_BACKOFF)

    def _sleep(self) -> None:
        due = [d for d in (self.claimer.next_due(), self.taker.due) if d is not None]
        timeout = MAX_SLEEP
        if due:
            timeout = min(timeout, max(0.0, (min(due) - self.clock.now()).total_seconds()))
        self.health.mark_sleeping(timeout)
        self.wake.wait(timeout)
        self.wake.clear()

    def _supervise(self) -> None:
        """Restart a background thread that died; stop the node, failed, if they keep dying: a
        node must never claim without heartbeating (others would take its runs over)."""
        threads: list[tuple[str, PeriodicThread]] = [
            ("heartbeat", self.heartbeat),
            ("leader", self.leader_thread),
        ]
        if self.presence is not None:
            threads.append(("presence", self.presence))
        for name, thread in threads:
            if self.stopping or thread.is_alive() or not thread.started:
                continue
            self.restarts[name] += 1
            if self.restarts[name] > MAX_RESTARTS:
                self.failure = f"the {name} thread kept dying"
                logger.critical("node %s stops: %s", self.node_id, self.failure,
                                extra=self.log_extra)  # fmt: skip
                self.request_stop(reason=self.failure)
                return
            logger.error("the %s thread of %s died; restarting it", name, self.node_id,
                         extra=self.log_extra)  # fmt: skip
            fresh = thread.restarted()
            setattr(self, {"leader": "leader_thread"}.get(name, name), fresh)
            fresh.start()

    # -- starting runs ------------------------------------------------------------------------

    def start_run(
        self,
        won: Won,
        planned: Planned,
        scheduled_at: datetime,
        payload: dict,
        on_done: Callable[[datetime], None] | None = None,
    ) -> None:
        """Run what this node won on a worker thread."""
        logger.info("won %s @ %s", planned.name, won.key, extra={
            **self.log_extra, "job": planned.name, "occurrence": won.key, "fence": won.fence,
        })  # fmt: skip
        try:
            merged = merged_payload(planned.definition.payload, payload)
        except TypeError as exc:
            self._refuse_run(won, planned, f"InvalidPayload: {exc}")
            return
        self.claimer.run_started(planned)

        def task() -> None:
            try:
                self.runner.run(won, planned, scheduled_at, merged, on_done)
            finally:
                self.claimer.run_ended(planned.name)
                self.taker.thread_freed()

        if not self.executor.submit(task):  # capacity is checked before claiming
            logger.error("executor full after claiming %s @ %s; running it on a spare thread",
                         planned.name, won.key, extra=self.log_extra)  # fmt: skip
            threading.Thread(target=task, daemon=True).start()

    def _refuse_run(self, won: Won, planned: Planned, error: str) -> None:
        """End a taken run that cannot start (its stored data is unusable) as failed, once."""
        logger.error("%s @ %s (run %s) cannot start: %s", planned.name, won.key, won.run_id,
                     error, extra={**self.log_extra, "job": planned.name})  # fmt: skip
        try:
            self.ledger.runs.finish(won, self.node_id, RunState.FAILED, self.clock.now(),
                                    error=safe_text(error), leads=planned.leads)  # fmt: skip
        except DatabaseError:
            release_broken_connections()  # its lease expires; the leader releases it

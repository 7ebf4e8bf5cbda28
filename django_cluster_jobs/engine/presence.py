"""Presence: a node's death noticed at once, not when its leases expire.

A node whose process ends (SIGKILL, OOM, a crash) stops renewing its leases, and its runs used to
wait out ``LEASE_TTL`` before the leader released them. Presence turns the death into an event:

- **PostgreSQL.** Each node holds a session advisory lock keyed by its registry row on a
  connection of its own, and waits on the lock of the next live node (the nodes in order of their
  row id form a ring, so every node is watched by exactly one peer). PostgreSQL releases a
  session's locks the moment the session ends, so the waiting peer is granted the lock at once and
  releases the dead node's runs. A node that loses its own presence session (a network partition,
  the connection killed) treats its runs as lost to it: it cancels their handlers, and the peer's
  release bumped their fences, so any late write is fenced out.
- **SQLite** (every node on one host): each node checks its peers' processes every half second,
  by process id and start time (a reused process id is told apart), with no statement unless one
  ended. Peers on another host, in another process-id namespace or on a system without ``/proc``
  cannot be judged and are left to their leases.

A frozen process (SIGSTOP) or a lost host keeps its session open, or cannot be judged: its runs
are released when their lease expires, as before.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from django.db import connections

from ..conf import app_settings
from ..coordination import Peer
from ..coordination.postgresql import ADVISORY_CLASS
from .periodic import PeriodicThread

logger = logging.getLogger(__name__)

#: The advisory lock class of node presence locks (the second int is the node's row id).
PRESENCE_CLASS = ADVISORY_CLASS + 2
#: Seconds a starting node waits for its own presence lock (a peer may hold it for a moment while
#: it releases the runs of this node id's previous process).
OWN_LOCK_WAIT = 10.0
#: Seconds between two looks at the local peers' processes (SQLite).
LOOK = 0.5
#: Seconds before a lost presence connection is opened again.
RECONNECT = 1.0


# -- process identity -------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _host_scope() -> str:
    """What two processes must share for one to judge the other by process id: the boot (same
    kernel, since the last restart) and the process-id namespace; "" where it cannot be known."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{namespace}" if boot else ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, "" for a zombie, None if absent."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command, which may hold spaces
    if len(fields) < 20:
        return None
    state, started = fields[0], fields[19]
    return "" if state in ("Z", "X") else started


def process_token() -> str:
    """This registration's identity: host scope, process id, start time, and a random part so
    two registrations in one process (a restart in place) differ too."""
    pid = os.getpid()
    scope = _host_scope()
    started = (_start_time(pid) or "") if scope else ""
    return f"{socket.gethostname()}|{scope}|{pid}|{started}|{uuid.uuid4().hex[:12]}"


def process_alive(token: str) -> bool | None:
    """Whether the process a token names is still running: True, False, or None when this
    process cannot judge it (another host or namespace, no ``/proc``, an unknown token)."""
    parts = token.split("|")
    if len(parts) != 5 or not parts[1] or not parts[3] or parts[1] != _host_scope():
        return None
    try:
        pid = int(parts[2])
    except ValueError:
        return None
    started = _start_time(pid)
    return started is not None and started == parts[3]


# -- the ring of watchers ---------------------------------------------------------------------


def settle() -> float:
    """Seconds a watch opened after losing its connection must be up before a granted lock
    counts as a death: long enough for every live peer to notice at its heartbeat that its own
    session dropped too, and take its lock again."""
    return 2 * app_settings.HEARTBEAT_INTERVAL + 2 * RECONNECT


def successor(peers: Sequence[Peer], own: int | None) -> Peer | None:
    """The live peer after ``own`` in row-id order, wrapping around; None when alone."""
    others = sorted((p for p in peers if p.pk != own), key=lambda p: p.pk)
    if own is None or not others:
        return None
    return next((p for p in others if p.pk > own), others[0])


NodeLost = Callable[[Peer, str], None]


class SessionPresence(PeriodicThread):
    """PostgreSQL: hold this node's presence lock and wait on the next live node's.

    Two connections: the *holder* only holds this node's lock and stays idle; the *waiter* waits
    on the next node's lock. Waiting and holding on one session would close a cycle around the
    ring (each session waiting for the next while holding what the previous waits for), which
    PostgreSQL's deadlock detector breaks by failing one of the waits.
    """

    what = "presence"
    at_once = True

    def __init__(
        self,
        alias: str,
        node_id: str,
        lost: NodeLost,
        own_lost: Callable[[], None],
        regained: Callable[[], None],
    ) -> None:
        super().__init__(name=f"cluster-jobs-presence-{node_id}")
        self.alias, self.node_id = alias, node_id
        self.lost, self.own_lost, self.regained = lost, own_lost, regained
        self.own: int | None = None
        self.peers: tuple[Peer, ...] = ()
        #: The registrations whose end this node handled: never handled twice. A node that lost
        #: its session and lives on registers a new process identity when it holds its lock
        #: again, and is watched again from then on.
        self.handled: set[tuple[int, str]] = set()
        self.watching: Peer | None = None
        self._holder: Any = None
        self._waiter: Any = None
        #: When the waiter connected (monotonic); -inf for the first, opened as the node starts.
        self._waiter_since = float("-inf")
        #: True once a presence connection of this node was lost (see settle()).
        self._reconnected = False
        self._warned = False
        self._guard = threading.Lock()
        self._retarget = threading.Event()

    @property
    def holding(self) -> bool:
        """Whether this node's presence lock is held (its holder connection is open)."""
        return self._holder is not None

    def interval(self) -> float:
        return RECONNECT

    def restarted(self) -> SessionPresence:
        fresh = SessionPresence(self.alias, self.node_id, self.lost, self.own_lost, self.regained)
        fresh.own, fresh.peers, fresh.handled = self.own, self.peers, self.handled
        with self._guard:  # the holder holds this node's lock: hand it over
            fresh._holder, self._holder = self._holder, None
        return fresh

    # -- called by the node and its heartbeat -------------------------------------------------

    def hold(self, own: int) -> bool:
        """Take this node's lock on a connection of its own, waiting a little for a peer that is
        releasing this node id's previous process; False when it cannot (leases still cover it)."""
        self.own = own
        try:
            conn = self._connect("hold")
            conn.execute("SELECT set_config('lock_timeout', %s, false)",
                         [str(int(OWN_LOCK_WAIT * 1000))])  # fmt: skip
            try:
                conn.execute("SELECT pg_advisory_lock(%s, %s)", [PRESENCE_CLASS, own])
                conn.execute("SELECT set_config('lock_timeout', '0', false)")
            except Exception:
                conn.close()
                raise
        except Exception as exc:
            if not self._warned:
                self._warned = True
                logger.warning("node %s runs without a presence lock (%s); a crash of this node is "
                               "noticed when its leases expire", self.node_id, exc,
                               extra={"node": self.node_id})  # fmt: skip
            return False
        with self._guard:
            self._holder = conn
        self._warned = False
        return True

    def observe(self, peers: Sequence[Peer]) -> None:
        """The live nodes as the heartbeat read them: watch the next one after this node; notice
        a holder connection that the server closed."""
        self.peers = tuple(peers)
        if self._holder is not None and not _open(self._holder):
            logger.error("node %s lost its presence session; a peer may release its runs, whose "
                         "late writes are then fenced out", self.node_id,
                         extra={"node": self.node_id})  # fmt: skip
            self._close("_holder")
            self._reconnected = True
            self.own_lost()
            self._cancel_wait()  # the thread takes the lock again
        if self._successor() != self.watching:
            self._retarget.set()
            self._cancel_wait()

    def stop(self, timeout: float = 10.0) -> None:
        self._halt.set()
        self._retarget.set()
        self._cancel_wait()
        super().stop(timeout)
        self._close("_waiter")
        self._close("_holder")

    # -- the thread ---------------------------------------------------------------------------

    def step(self) -> None:
        import psycopg

        if self._holder is None:
            if self.own is None or not self.hold(self.own):
                return
            if self._reconnected:
                self.regained()
        try:
            if self._waiter is None:
                waiter = self._connect("watch")
                with self._guard:
                    self._waiter = waiter
                self._waiter_since = time.monotonic() if self._reconnected else float("-inf")
            while not self.stopped and self._holder is not None:
                try:
                    self._watch_once()
                except psycopg.errors.QueryCanceled:
                    continue  # the ring changed, or the node stops
        except psycopg.OperationalError as exc:
            if not self.stopped:
                logger.warning("presence watch of %s failed (%s); watching again",
                               self.node_id, exc, extra={"node": self.node_id})  # fmt: skip
            self._close("_waiter")
            self._reconnected = True

    def _watch_once(self) -> None:
        self._retarget.clear()
        target = self._successor()
        self.watching = target
        if target is None:
            self._retarget.wait(LOOK * 2)
            return
        self._waiter.execute("SELECT pg_advisory_lock(%s, %s)", [PRESENCE_CLASS, target.pk])
        if time.monotonic() - self._waiter_since < settle():
            # This watch began after a connection loss of its own: the whole database may have
            # dropped every session (a restart, a failover), and the peer not have taken its
            # lock again yet. Not a death until this watch has been up for a while.
            self._unlock(target.pk)
            self._retarget.wait(RECONNECT)
            return
        try:
            logger.warning("node %s: the database session of node %s ended; releasing its runs",
                           self.node_id, target.node_id, extra={"node": self.node_id})  # fmt: skip
            self.lost(target, "its database session ended")
        finally:
            self._unlock(target.pk)
        self.handled.add((target.pk, target.process))

    def _successor(self) -> Peer | None:
        peers = [p for p in self.peers if (p.pk, p.process) not in self.handled]
        return successor(peers, self.own)

    def _unlock(self, pk: int) -> None:
        """Give a dead peer's lock back, so its next process can take it; a cancel meant for a
        wait that lands on this statement is retried past."""
        import psycopg

        for _ in range(5):
            try:
                self._waiter.execute("SELECT pg_advisory_unlock(%s, %s)", [PRESENCE_CLASS, pk])
                return
            except psycopg.errors.QueryCanceled:
                continue

    # -- the connections ----------------------------------------------------------------------

    def _connect(self, role: str) -> Any:
        wrapper = connections[self.alias]
        name = f"cluster-jobs-{role}:{self.node_id}"[:63]
        conn = wrapper.get_new_connection(
            {**wrapper.get_connection_params(), "application_name": name}
        )
        conn.autocommit = True
        return conn

    def _cancel_wait(self) -> None:
        with self._guard:
            conn = self._waiter
        if conn is not None:
            try:
                conn.cancel_safe(timeout=2.0)
            except Exception:  # the connection is gone already: nothing waits
                logger.debug("presence cancel failed", exc_info=True)

    def _close(self, which: str) -> None:
        with self._guard:
            conn = getattr(self, which)
            setattr(self, which, None)
        if conn is not None:
            try:
                conn.close()
            except Exception:
                logger.debug("presence close failed", exc_info=True)


def _open(conn: Any) -> bool:
    """Whether an idle connection is still open, without a statement: a server that ended the
    session has sent its goodbye, which the socket shows as readable."""
    from psycopg.pq import ConnStatus

    if conn.closed:
        return False
    pgconn = conn.pgconn
    try:
        readable, _, _ = select.select([pgconn.socket], [], [], 0)
        if readable:
            pgconn.consume_input()
            while (notice := pgconn.notifies()) is not None:
                del notice
    except Exception:
        return False
    return pgconn.status == ConnStatus.OK


class LocalPresence(PeriodicThread):
    """SQLite: look at the live peers' processes on this host every half second."""

    what = "presence"

    def __init__(self, node_id: str, lost: NodeLost) -> None:
        super().__init__(name=f"cluster-jobs-presence-{node_id}")
        self.node_id, self.lost = node_id, lost
        self.own: int | None = None
        self.peers: tuple[Peer, ...] = ()
        self._seen_dead: set[str] = set()

    def interval(self) -> float:
        return LOOK

    def restarted(self) -> LocalPresence:
        fresh = LocalPresence(self.node_id, self.lost)
        fresh.own, fresh.peers = self.own, self.peers
        return fresh

    def hold(self, own: int) -> bool:
        self.own = own
        return True

    def observe(self, peers: Sequence[Peer]) -> None:
        self.peers = tuple(p for p in peers if p.pk != self.own)

    def step(self) -> None:
        for peer in self.peers:
            if peer.process in self._seen_dead or process_alive(peer.process) is not False:
                continue
            logger.warning("node %s: the process of node %s ended; releasing its runs",
                           self.node_id, peer.node_id, extra={"node": self.node_id})  # fmt: skip
            self.lost(peer, "its process ended")
            self._seen_dead.add(peer.process)

"""The taker: start the due pending runs (enqueued, retried, taken over) a node has room for."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db import DatabaseError

from ..conf import app_settings
from ..coordination import Won
from ..ledger.leases import lease_ttl, lease_until
from ..policies.overlap import limited
from .executor import release_broken_connections
from .planner import Planned
from .protocols import ClaimerHost
from .wakeups import Wake, passed_on, share

logger = logging.getLogger("django_cluster_jobs.engine.node")


class Taker:
    """Looks for due pending runs when notified, at their due time, or at each poll."""

    def __init__(self, host: ClaimerHost) -> None:
        self.host = host
        #: When to look for pending runs next; None while nothing is known to come.
        self.due: datetime | None = None
        #: True while due runs wait for a free thread (or a job's or queue's limit).
        self.blocked = False
        #: True when the next look is a poll (nothing announced a run): it reads before it takes.
        self.polling = False
        #: How many wake-ups came, so one that comes during a pass is not lost with its plan.
        self._woken = 0
        #: The notifications for this node since the last look, each with its share of runs.
        self.wakes: deque[tuple[Wake | None, int]] = deque()

    def wake(self) -> None:
        """Look for pending runs now (from any thread)."""
        self._woken += 1
        self.polling = False
        self.due = self.host.clock.now()
        self.host.wake.set()

    def notified(self, wake: Wake | None) -> None:
        """Runs became pending (from the listener's thread): look now if the notification is
        for this node, else one poll interval later, in case the node it is for cannot take
        them and nothing passes them on (see engine.wakeups)."""
        host = self.host
        mine = share(wake, host.live_nodes, host.node_id, host.threads)
        if mine:
            self.wakes.append((wake, mine))
            self.wake()
            return
        later = host.clock.now() + timedelta(seconds=app_settings.POLL_INTERVAL)
        if self.due is None or self.due > later:
            self.due = later
            host.wake.set()  # the loop sleeps until this new time

    def thread_freed(self) -> None:
        """A handler finished: if due pending runs were waiting for a thread, look now."""
        if self.blocked:
            self.wake()

    def tick(self, jobs: Mapping[int, Planned], now: datetime) -> None:
        """Take what is due of ``jobs`` (by definition id), if it is time to look; then plan
        the next look."""
        if self.due is None or self.due > now:
            return
        woken = self._woken
        free = 0 if self.host.stopping else self.host.free_threads()
        wakes = [self.wakes.popleft() for _ in range(len(self.wakes))]
        taken, next_due = self._take(jobs, free, now)
        for won in taken:
            self.host.start_run(won, jobs[won.job_id], won.scheduled_at or now, won.payload or {})
        self._plan(now, next_due)
        if len(taken) >= free:  # due runs may be left that this node had no thread for
            self._pass_on(wakes, free)
        if self._woken != woken and not self.blocked:  # announced during the pass, perhaps
            self.wake()  # after its last read; a blocked taker looks when a thread frees up

    def _pass_on(self, wakes: list[tuple[Wake | None, int]], free: int) -> None:
        """Ask the next nodes for the share of each notification this node had no thread for."""
        nodes, threads = len(self.host.live_nodes), self.host.threads
        for wake, mine in wakes:
            used = min(mine, free)
            free -= used
            onward = None if wake is None else passed_on(wake, mine - used, nodes, threads)
            if onward is not None:
                try:
                    self.host.ledger.vendor.notify_payload(onward.payload())
                except Exception as exc:  # the other nodes' fallback look still finds them
                    release_broken_connections()
                    logger.warning("could not pass pending runs on: %s", exc,
                                   extra=self.host.log_extra)  # fmt: skip

    def _take(
        self, jobs: Mapping[int, Planned], free: int, now: datetime
    ) -> tuple[list[Won], datetime | None]:
        # A node that polls reads first, so an idle poll writes nothing (on SQLite it takes no
        # writer lock). A listening node looks only when notified or at a known due time, when
        # there is most likely something to take, so it takes first.
        ledger = self.host.ledger
        try:
            next_due = now if self.host.listening and free > 0 and not self.polling else None
            if next_due is None:
                next_due = ledger.next_pending_due(list(jobs))
            if free < 1 or next_due is None or next_due > now:
                return [], next_due
            taken = self._take_limited(jobs, free)
            fast = [pk for pk, p in jobs.items() if limited(p.definition) is None]
            if free > len(taken) and fast:
                taken += ledger.vendor.take_pending(
                    self.host.node_id, fast, free - len(taken), now, lease_until(now)
                )
            if len(taken) >= free:  # every thread is busy: look again when one frees up
                return taken, now
        except Exception as exc:  # a database error, or a stored run the take cannot rank
            release_broken_connections()
            logger.warning(
                "could not take pending runs (fail-closed): %s", exc, extra=self.host.log_extra,
                exc_info=not isinstance(exc, DatabaseError),
            )  # fmt: skip
            return [], None
        try:  # apart from the take: what was taken is run whatever this look says
            return taken, ledger.next_pending_due(list(jobs))
        except Exception as exc:
            release_broken_connections()
            logger.warning("could not look for the next pending run: %s", exc,
                           extra=self.host.log_extra)  # fmt: skip
            return taken, now

    def _take_limited(self, jobs: Mapping[int, Planned], free: int) -> list[Won]:
        """Take pending runs of jobs with a concurrency or queue limit, one at a time, locked."""
        taken: list[Won] = []
        for pk, planned in jobs.items():
            gate = limited(planned.definition)
            while gate is not None and len(taken) < free:
                won = self.host.ledger.gates.claim_pending_gated(
                    self.host.node_id, pk, gate, self.host.clock.now, lease_ttl()
                )
                if not won:
                    break
                taken += won
        return taken

    def _plan(self, now: datetime, next_due: datetime | None) -> None:
        """Look again when the next pending run is due; poll where nothing will notify us (and,
        seldom, where a notification can fail to come).

        A run still due after a pass could not be taken (no free thread, or its job or queue is
        at its limit): look again a poll interval later, or as soon as a thread here frees up,
        never in a busy loop.
        """
        self.blocked = next_due is not None and next_due <= now
        if self.blocked:
            next_due = now + timedelta(seconds=app_settings.POLL_INTERVAL)
        every = self.host.look_every()
        self.polling = False
        if every is not None:
            poll = now + timedelta(seconds=every)
            if next_due is None or poll < next_due:
                next_due, self.polling = poll, True
        self.due = next_due

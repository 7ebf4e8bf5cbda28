"""``cluster_lock``: the lease table offered to application code, fenced and self-renewing."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from .conf import app_settings
from .exceptions import LockLost, LockNotAcquired

if TYPE_CHECKING:
    from .ledger.leases import Held

logger = logging.getLogger(__name__)

#: Prefix of application lock names in the Lease table, apart from the scheduler's own leases.
PREFIX = "lock:"


@dataclass
class LockHandle:
    """What ``cluster_lock`` yields: the fencing token to pass along with every guarded write."""

    name: str
    fence: int
    lost: threading.Event = field(default_factory=threading.Event)

    @property
    def is_lost(self) -> bool:
        """True once the lease could not be renewed: stop writing, another holder may exist."""
        return self.lost.is_set()


def _now(using: str) -> datetime:
    """The database's current time (leases are judged on it), or this machine's if unreachable."""
    from django.db.models.functions import Now

    from .models import Lease

    try:
        found = Lease.objects.using(using).annotate(db_now=Now()).values_list("db_now", flat=True)
        return found.first() or datetime.now(UTC)
    except DatabaseError:
        return datetime.now(UTC)


@contextlib.contextmanager
def cluster_lock(
    name: str,
    ttl: float = 30.0,
    *,
    timeout: float = 0.0,
    holder: str | None = None,
    using: str | None = None,
) -> Iterator[LockHandle]:
    """Hold the cluster-wide lock ``name``; renews itself every ttl/3 while the block runs.

    Raises LockNotAcquired if another holder keeps it past ``timeout`` seconds. Pass
    ``handle.fence`` to the resource you write and have it reject smaller tokens. If the lease
    is lost while the block runs (taken over, or not renewable before it expired),
    ``handle.is_lost`` turns true at once and LockLost is raised when the block ends.
    """
    using = using or app_settings.DATABASE
    token, lease_name = uuid.uuid4().hex, PREFIX + name
    held = _acquire(using, lease_name, holder or app_settings.node_id(), token, ttl, timeout)
    handle = LockHandle(name, held.fence)
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(using, held, ttl, stop, handle), daemon=True)
    renewer.start()
    try:
        yield handle
    finally:
        stop.set()
        renewer.join(timeout=ttl)
        with contextlib.suppress(DatabaseError):
            from .ledger import leases

            leases.release(using, held)
    if handle.is_lost:
        raise LockLost(name)


def _acquire(using: str, name: str, holder: str, token: str, ttl: float, timeout: float) -> Held:
    from .ledger import leases

    deadline = time.monotonic() + timeout
    while True:
        held = leases.acquire(using, name, holder, token, _now(using), timedelta(seconds=ttl))
        if held is not None:
            return held
        if time.monotonic() >= deadline:
            raise LockNotAcquired(name.removeprefix(PREFIX))
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _renew(using: str, held: Held, ttl: float, stop: threading.Event, handle: LockHandle) -> None:
    from .ledger import leases

    expires_at = held.expires_at
    try:
        while not stop.wait(ttl / 3):
            try:
                now = _now(using)
                renewed = leases.acquire(
                    using,
                    held.name,
                    held.holder,
                    held.token,
                    now,
                    timedelta(seconds=ttl),
                    previous=held,
                )
            except DatabaseError:
                if datetime.now(UTC) >= expires_at:
                    logger.error("cluster lock %s expired while it could not be renewed", held.name)
                    handle.lost.set()
                    return
                logger.warning("could not renew cluster lock %s; retrying", held.name)
                continue
            if renewed is None or renewed.fence != held.fence:
                logger.error("cluster lock %s was lost to another holder", held.name)
                handle.lost.set()
                return
            expires_at = renewed.expires_at
    finally:
        connections.close_all()

"""Named, fenced leases on the database: the leader and application cluster locks.

Acquire and renew are compare-and-set updates; the fencing token goes up on every change of
holder and stays on renewal. Times are cluster time (the caller's database-corrected clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import F, Q

from ..conf import app_settings
from ..coordination.base import lease_row
from ..models import Lease


@dataclass(frozen=True)
class Held:
    """A lease this holder has: its token and fencing token, valid until ``expires_at``."""

    name: str
    holder: str
    token: str
    fence: int
    expires_at: datetime
    acquired: bool  # True when this call took it over (a change of holder)


def acquire(
    alias: str,
    name: str,
    holder: str,
    token: str,
    now: datetime,
    ttl: timedelta,
    previous: Held | None = None,
) -> Held | None:
    """Renew the lease if ``token`` holds it, else take it if free or expired; None if held.

    ``previous`` is what the last successful call returned for this token: a renewal then needs
    no re-read, since only this token's holder writes this token and the fence changes only when
    the holder does (which goes through the other branch).
    """
    leases = lease_row(alias, name)
    until = now + ttl
    if leases.filter(token=token, expires_at__gt=now).update(expires_at=until):
        if previous is not None and previous.token == token and previous.name == name:
            return Held(name, previous.holder, token, previous.fence, until, acquired=False)
        return _held(alias, name, token, acquired=False)
    free = Q(expires_at__isnull=True) | Q(expires_at__lte=now)
    if leases.filter(free).update(
        holder=holder, token=token, fence=F("fence") + 1, acquired_at=now, expires_at=until
    ):
        return _held(alias, name, token, acquired=True)
    if not leases.exists():  # an operator deleted the row: create it again and take it
        lease_row(alias, name, recheck=True)
        return acquire(alias, name, holder, token, now, ttl)  # no previous: it was lost
    return None


def _held(alias: str, name: str, token: str, *, acquired: bool) -> Held | None:
    row = Lease.objects.using(alias).filter(name=name, token=token).first()
    if row is None or row.expires_at is None:
        return None
    return Held(name, row.holder, token, row.fence, row.expires_at, acquired)


def still_held(alias: str, held: Held, now: datetime) -> bool:
    """Lock the lease row until the transaction ends and tell whether ``held`` is still valid.

    Call inside ``transaction.atomic``: writes made in the same transaction are then fenced by
    the lease (a deposed holder's writes are rejected; a new holder waits for this commit).
    """
    return bool(
        Lease.objects.using(alias)
        .filter(name=held.name, token=held.token, fence=held.fence, expires_at__gt=now)
        .update(expires_at=F("expires_at"))
    )


def release(alias: str, held: Held) -> bool:
    """Give the lease up at once so another holder need not wait for expiry."""
    return bool(
        Lease.objects.using(alias)
        .filter(name=held.name, token=held.token)
        .update(holder="", token="", expires_at=None)
    )


def lease_ttl() -> timedelta:
    """How long a run lease lasts (LEASE_TTL), for a claim that takes its lease later."""
    return timedelta(seconds=app_settings.LEASE_TTL)


def lease_until(now: datetime) -> datetime:
    """When a run lease taken or renewed at ``now`` expires (LEASE_TTL later)."""
    return now + lease_ttl()

"""Django signals for the run lifecycle.

Each is sent once per event, by the node whose fenced write recorded it, with ``sender`` = the
job name and these keyword arguments: ``run_id``, ``job``, ``key``, ``node``, ``attempt``, plus:

- ``run_started``: ``scheduled_at``, the occurrence's instant (or the enqueued run's).
- ``run_succeeded``: ``result``, ``finished_at`` (the end as stored).
- ``run_failed``: ``state`` (failed or timed_out), ``error``, ``will_retry``.
- ``run_retried``: ``due_at`` of the next attempt.
- ``run_dead_lettered``: ``error``.
- ``run_skipped``: ``reason``.
- ``run_lost``: ``reason``.
- ``run_missed``: ``reason``; sent by the leader for each occurrence it records missed.
- ``run_taken_over``: ``cause`` (``lease_expired`` or ``node_lost``), ``reason``; sent by the
  node that took the run from an owner that went away (``node``), once the release committed;
  ``attempt`` is the next attempt's.
- ``run_fenced_out``: ``state``, the end this node's write-back tried to record.

Receivers run in the scheduler's threads; an exception in one is logged, never raised.
"""

import logging

from django.dispatch import Signal

logger = logging.getLogger(__name__)

run_started = Signal()
run_succeeded = Signal()
run_failed = Signal()
run_retried = Signal()
run_dead_lettered = Signal()
run_skipped = Signal()
run_lost = Signal()
run_missed = Signal()
run_taken_over = Signal()
run_fenced_out = Signal()


def send(signal: Signal, job: str, **kwargs: object) -> None:
    """Send ``signal`` for ``job``; log (never raise) what a receiver raised."""
    for receiver, response in signal.send_robust(sender=job, job=job, **kwargs):
        if isinstance(response, Exception):
            logger.error("signal receiver %r failed: %s", receiver, response, exc_info=response)

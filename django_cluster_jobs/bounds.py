"""The bounds of every value a job definition or a run may hold (re-exported by validation).

Lengths are the columns' (tests compare them with the models). Counts fit PostgreSQL's 32-bit
integers. Durations and run times keep the engine's date arithmetic inside the calendar: every
run time lies between EARLIEST_RUN_AT and LATEST_RUN_AT, and twice the longest duration added to
LATEST_RUN_AT, or taken from EARLIEST_RUN_AT, is still a date (years 1 to 9999).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from .choices import (
    BackoffKind,
    Delivery,
    Executor,
    Misfire,
    Overlap,
    Placement,
    ScheduleKind,
    Source,
)

#: How long a circuit breaker pauses its job when a threshold is set without a cooldown (at
#: every door: the decorator, the admin, the API and stored rows).
DEFAULT_COOLDOWN = timedelta(minutes=5)

#: Django Tasks' priority range; a larger priority runs sooner.
PRIORITY_MIN = -100
PRIORITY_MAX = 100

#: A run's reason column (JobRun.reason; an event's reason is text of any length).
REASON_MAX_LENGTH = 200
#: Column lengths (JobDefinition.name, callable_name, cron, timezone, queue, pause_reason).
NAME_MAX_LENGTH = 200
CRON_MAX_LENGTH = 200
TIMEZONE_MAX_LENGTH = 64
QUEUE_MAX_LENGTH = 100
PAUSE_REASON_MAX_LENGTH = 200
#: An idempotency key: JobRun.key holds ``<outcome>:<key>`` in 255 characters.
KEY_MAX_LENGTH = 200
#: Node tags in ``requires``: how many, and how long each.
TAGS_MAX = 100
#: Most predecessors one job waits for (each success reads them all, in one query).
AFTER_MAX = 100
TAG_MAX_LENGTH = 100

#: A job's name is what the API's URLs route (``/jobs/<name>/``) and the admin, logs and metrics
#: show: letters, digits and ``_ . : -``, starting with a letter, a digit or ``_``. Default names
#: (``module.qualname`` of a module-level function) always match.
NAME_PATTERN = re.compile(r"\w[\w.:-]*")

#: The largest PositiveIntegerField value PostgreSQL stores (breaker_threshold, max_concurrency).
COUNT_MAX = 2**31 - 1
#: Attempts of one run: also bounds ``backoff.factor ** attempts``, so that no float overflows.
MAX_ATTEMPTS = 100
#: Missed occurrences the run_all misfire policy may queue at once.
CATCH_UP_LIMIT_MAX = 10_000

#: The longest interval, catch-up window and breaker cooldown (ten years of 366 days).
MAX_INTERVAL = timedelta(days=3660)
MAX_WINDOW = MAX_INTERVAL
MAX_COOLDOWN = MAX_INTERVAL
#: The longest timeout: a thread's timer must accept it on every platform (threading.TIMEOUT_MAX
#: is about 49 days on Windows).
MAX_TIMEOUT = timedelta(days=30)

#: Backoff: ``base`` and ``cap`` in seconds, at most MAX_INTERVAL; ``factor`` at most this, so
#: ``base * factor ** (MAX_ATTEMPTS - 1)`` stays a finite float.
BACKOFF_SECONDS_MAX = MAX_INTERVAL.total_seconds()
BACKOFF_FACTOR_MAX = 100

#: The earliest and latest time a run may be due (enqueue's ``at``, a pause's end).
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_RUN_AT = datetime(9000, 1, 1, tzinfo=UTC)

#: The largest id of the app's tables (a signed 64-bit integer column).
ID_MAX = 2**63 - 1


#: Bounds of the CLUSTER_JOBS settings (checked by cluster_jobs.E001 and runscheduler's options):
#: what the node's threads, timers and date arithmetic can hold. Seconds of the node's timings
#: (leases, heartbeats, grace, polls) and runscheduler --duration: a thread's wait must accept
#: them (see MAX_TIMEOUT).
SETTING_SECONDS_MAX = int(MAX_TIMEOUT.total_seconds())
#: Days of finished runs kept: a century.
RETENTION_DAYS_MAX = 36_600
#: Executor threads of one node, and occurrences claimed in one statement.
THREADS_MAX = 1_000
CLAIM_BATCH_MAX = 10_000

#: How deeply lists and objects may nest in a payload.
PAYLOAD_DEPTH_MAX = 32

#: The choices of the policy columns, from their one source (choices.py).
SCHEDULE_KINDS = tuple(ScheduleKind.values)
SOURCES = tuple(Source.values)
PLACEMENTS = tuple(Placement.values)
DELIVERIES = tuple(Delivery.values)
OVERLAPS = tuple(Overlap.values)
MISFIRES = tuple(Misfire.values)
EXECUTORS = tuple(Executor.values)
BACKOFF_KINDS = tuple(BackoffKind.values)
BACKOFF_KEYS = ("kind", "base", "factor", "cap")

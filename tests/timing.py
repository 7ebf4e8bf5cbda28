"""One time scale for every deadline of the suite, and the marker that says a test depends on it.

``CLUSTER_JOBS_TEST_TIME_SCALE`` (default 1; read here and nowhere else) multiplies every time a
test waits on or gives a scheduler: the deadlines below, the scheduler settings of
``tests/settings.py`` (heartbeat, lease, grace, leader lease, dead-after, poll, SQLite's busy
timeout), the durations of the test jobs in ``tests/jobs.py`` and the ``--duration`` of the
scheduler processes. A slower machine
raises that one number; nothing else changes. (Presence's own look at its peers, a product
constant, is not scaled: the deadlines that include it allow for it.)

A deadline states how long a healthy cluster may take, not how long it usually takes: a test that
reaches one has found a node that is stuck, or a guarantee broken, never a slow machine.

A test whose outcome depends on wall-clock time carries the ``timing`` marker (``multinode``, for
the tests that start real ``runscheduler`` processes, implies it). CI runs the marked tests one
suite at a time, never beside another suite's; the rest run side by side. A hang guard alone (a
deadline hundreds of times longer than the work it guards, such as a race's) does not make a test
timing-dependent, but it is scaled all the same. The helpers below and
in ``tests/conftest.py`` refuse to run in a test without the marker, and
``tests/unit/test_suite_rules.py`` refuses a bare number of seconds in a test, so neither can be
forgotten.
"""

from __future__ import annotations

import os
import time

#: The one factor; every deadline of the suite is a multiple of it.
SCALE_VARIABLE = "CLUSTER_JOBS_TEST_TIME_SCALE"


def _scale() -> float:
    raw = os.environ.get(SCALE_VARIABLE, "") or "1"
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if not 0.1 <= scale <= 100:
        raise RuntimeError(
            f"{SCALE_VARIABLE}={raw!r}: give a number from 0.1 to 100 (1 is the default)"
        )
    return scale


SCALE = _scale()


def scaled(seconds: float) -> float:
    """Return ``seconds`` of a healthy cluster on a reference machine, on this machine's scale."""
    return seconds * SCALE


def arg(seconds: float) -> str:
    """Return ``scaled(seconds)`` as a command-line or environment value."""
    return f"{scaled(seconds):g}"


# -- how long a healthy cluster may take -------------------------------------------------------

#: Any one scheduler subprocess, from its start to its end: longer than any wait on one.
PROCESS_LIFE = scaled(120)
#: A ``runscheduler`` process starts Django, registers its node and is active.
NODE_START = scaled(30)
#: A node that was asked to stop (SIGTERM, drain) hands its work back and exits.
NODE_EXIT = scaled(30)
#: A live node acts on something it was told or polls for (a pending run, a cancel, a pause, a
#: drain, a definition change), including one poll interval and a heartbeat or two.
REACT = scaled(10)
#: A run of a test job that works for at most a few seconds ends, wherever it runs.
RUN_ENDS = scaled(30)
#: A cluster runs a handful of occurrences of a per-second job (the job's own pace is one a
#: second; the deadline allows for a loaded machine and the nodes' start).
FEW_SECONDS_OF_RUNS = scaled(40)
#: Threads racing on their own connections all end (a hung racer fails the race).
RACE = scaled(60)
#: A database session is cut, or a statement is cancelled, and the server says so.
SERVER_ANSWERS = scaled(10)


def pause(seconds: float) -> None:
    """Let the cluster work for ``seconds`` (already scaled) in a test marked ``timing``."""
    require_timing_marker("pause()")
    time.sleep(seconds)


# -- the marker --------------------------------------------------------------------------------

#: The running test's ``timing`` marker, set by tests/conftest.py before each test; None before
#: any test (collection) and in a test without the marker.
_current: dict[str, object] = {"test": None, "timing": False}


def entering(test_id: str, marked: bool) -> None:
    """Record which test runs and whether it carries the ``timing`` marker (conftest calls it)."""
    _current["test"], _current["timing"] = test_id, marked


def require_timing_marker(what: str) -> None:
    """Fail loudly when a deadline helper runs in a test that is not marked ``timing``."""
    if _current["test"] is not None and not _current["timing"]:
        import pytest

        pytest.fail(
            f"{_current['test']} uses {what}, which depends on wall-clock time, but is not "
            "marked timing: add @pytest.mark.timing (or pytestmark) so that CI runs it apart "
            "from other suites (tests/timing.py says why)",
            pytrace=False,
        )

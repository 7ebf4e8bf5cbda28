"""The harness's own deadlines: a hung racer and an overdue scheduler fail the test."""

import re
import threading

import pytest

from tests import timing
from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)

#: The race deadline of the hung-racer test: short, since the test waits it out, yet long enough
#: for two threads to connect and meet at the start on a loaded machine.
HUNG_AFTER = timing.scaled(1)
#: The deadline of the overdue scheduler: its watchdog must kill it long before it would end.
OVERDUE_AFTER = timing.scaled(1)


def test_race_returns_each_racers_result_in_order():
    assert race(3, lambda i: i * 10) == [0, 10, 20]


@pytest.mark.timing
def test_race_fails_when_a_racer_hangs():
    release = threading.Event()
    hung = re.escape(f"racer-1 still running after {HUNG_AFTER:g} s: hung")
    try:
        with pytest.raises(AssertionError, match=hung):
            # racer 1 waits longer than any race may take: only the deadline ends the race
            race(2, lambda i: i == 1 and release.wait(timing.RACE), deadline=HUNG_AFTER)
    finally:
        release.set()


def test_race_raises_what_a_racer_raised():
    def racer(i: int) -> int:
        if i == 2:
            raise LookupError("racer 2 failed")
        return i

    with pytest.raises(LookupError, match="racer 2 failed"):
        race(3, racer)


@pytest.mark.timing
def test_a_scheduler_outliving_its_deadline_is_killed_and_fails_the_test(start_scheduler):
    node = start_scheduler("overdue", deadline=OVERDUE_AFTER)
    overdue = re.escape(f"outlived its {OVERDUE_AFTER:g} s deadline and was killed")
    with pytest.raises(pytest.fail.Exception, match=overdue):
        node.wait(timeout=OVERDUE_AFTER + timing.NODE_EXIT)  # killed at its deadline, then reaped
    assert node.outlived_deadline and node.proc.returncode == -9
    node.outlived_deadline = False  # reported above; the teardown has nothing more to fail

"""The harness's own deadlines: a hung racer and an overdue scheduler fail the test."""

import threading

import pytest

from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)


def test_race_returns_each_racers_result_in_order():
    assert race(3, lambda i: i * 10) == [0, 10, 20]


def test_race_fails_when_a_racer_hangs():
    release = threading.Event()
    try:
        with pytest.raises(AssertionError, match=r"racer-1 still running after 0\.5 s: hung"):
            race(2, lambda i: i == 1 and release.wait(30), deadline=0.5)
    finally:
        release.set()


def test_race_raises_what_a_racer_raised():
    def racer(i: int) -> int:
        if i == 2:
            raise LookupError("racer 2 failed")
        return i

    with pytest.raises(LookupError, match="racer 2 failed"):
        race(3, racer)


def test_a_scheduler_outliving_its_deadline_is_killed_and_fails_the_test(start_scheduler):
    node = start_scheduler("overdue", deadline=1.0)
    with pytest.raises(pytest.fail.Exception, match="outlived its 1 s deadline and was killed"):
        node.wait(timeout=30)
    assert node.outlived_deadline and node.proc.returncode == -9
    node.outlived_deadline = False  # reported above; the teardown has nothing more to fail

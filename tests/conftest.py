"""Shared fixtures: ledgers on every path, and real scheduler subprocesses with deadlines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_cluster_jobs.ledger import get_ledger
from tests import timing

#: Fixtures shared by the API test modules.
pytest_plugins = ["tests.api_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
#: Hard deadline of any one scheduler subprocess started by a test, from its start: longer than
#: any wait a test makes on one. A watchdog kills a process that outlives it and fails the test.
PROCESS_DEADLINE = timing.PROCESS_LIFE


def pytest_report_header(config: pytest.Config) -> str:
    return f"cluster-jobs database: {connection.vendor} ({connection.settings_dict['NAME']})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # a test that starts scheduler processes depends on time (tests/timing.py)
        if item.get_closest_marker("multinode") and not item.get_closest_marker("timing"):
            item.add_marker(pytest.mark.timing)
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason=f"needs PostgreSQL; this run uses {connection.vendor}")
    for item in items:
        if "postgresql" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    timing.entering(item.nodeid, item.get_closest_marker("timing") is not None)


@pytest.fixture(params=["native", "orm"])
def ledger(request: pytest.FixtureRequest):
    """The vendor's fast path and the portable ORM path: both must pass the same contract."""
    return get_ledger(kind="auto" if request.param == "native" else "orm")


def database_url() -> str:
    """The URL of the database the tests use (the test database, not the configured one)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or ""
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    host = s.get("HOST") or "127.0.0.1"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    return f"{scheme}://{user}{password}@{host}{port}/{s['NAME']}"


class Scheduler:
    """A real ``manage.py runscheduler`` subprocess on the test database."""

    def __init__(
        self,
        node_id: str,
        args: list[str],
        env: dict[str, str],
        log: Path,
        deadline: float = PROCESS_DEADLINE,
    ) -> None:
        timing.require_timing_marker("a scheduler process")
        self.node_id, self.log = node_id, log
        self._out = log.open("wb")
        cmd = [sys.executable, "-m", "django", "runscheduler", "--node-id", node_id, *args]
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.deadline, self.outlived_deadline = deadline, False
        self._watchdog = threading.Timer(deadline, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _expire(self) -> None:
        if self.proc.poll() is None:
            self.outlived_deadline = True
            self.kill()

    def _check_deadline(self) -> None:
        if self.outlived_deadline:
            pytest.fail(self.overdue())

    def overdue(self) -> str:
        return (
            f"scheduler {self.node_id} outlived its {self.deadline:g} s deadline and was "
            f"killed:\n{self.output()}"
        )

    def started(self) -> bool:
        """Whether the node has logged its start: its stop handlers are in place by then."""
        return "started with" in self.output()

    def signal(self, signum: int) -> None:
        """Send ``signum``; a stop request (SIGTERM, SIGINT) only once the node has started.

        Until ``runscheduler`` installs its handlers, Python's default action for the signal ends
        the process at once (exit -15): a node still importing Django holds nothing, and that is
        no graceful stop to test. A test that sends one must not depend on how fast a process
        boots, so this waits (NODE_START) for the start, or for the process to have ended.
        """
        if signum in (signal.SIGTERM, signal.SIGINT):
            wait_until(lambda: self.started() or self.proc.poll() is not None, timing.NODE_START)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; kill it and fail if it outlives ``timeout``."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(
                f"scheduler {self.node_id} did not exit within {timeout}s:\n{self.output()}"
            )
        self._check_deadline()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=timing.NODE_EXIT)

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def close(self) -> str:
        """Stop the watchdog and the process; return why it failed when the watchdog killed it."""
        self._watchdog.cancel()
        self.kill()
        why = self.overdue() if self.outlived_deadline else ""
        self._out.close()
        return why


@pytest.fixture
def start_scheduler(tmp_path: Path) -> Iterator[Callable[..., Scheduler]]:
    """Start scheduler subprocesses; every one is killed at teardown, whatever happened."""
    started: list[Scheduler] = []

    def start(
        node_id: str, *args: str, jobs: str = "", deadline: float = PROCESS_DEADLINE, **env: str
    ) -> Scheduler:
        child_env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "CLUSTER_JOBS_TEST_JOBS": jobs,
            "PYTHONPATH": str(ROOT),
            **env,
        }
        log = tmp_path / f"{node_id}.log"
        proc = Scheduler(node_id, list(args), child_env, log, deadline)
        started.append(proc)
        return proc

    yield start
    overdue = [why for why in (proc.close() for proc in started) if why]
    if overdue:
        pytest.fail("\n".join(overdue))


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> object:
    """Poll ``predicate`` until it is truthy; fail the test when ``timeout`` seconds pass."""
    timing.require_timing_marker("wait_until()")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    pytest.fail(f"condition not met within {timeout:g} s (time scale {timing.SCALE:g})")


@pytest.fixture
def registry_restored() -> Iterator[None]:
    """Unregister every job the test declared, whatever its name (valid or not)."""
    from django_cluster_jobs.registry import registry

    before = {declared.name for declared in registry}
    yield
    for name in {declared.name for declared in registry} - before:
        registry.unregister(name)

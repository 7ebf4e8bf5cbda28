"""The probe server of a real node, asked over real HTTP: startup, liveness, readiness."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connections
from django.test import override_settings

from django_cluster_jobs import services
from django_cluster_jobs.coordination import get_vendor
from django_cluster_jobs.engine import Node
from django_cluster_jobs.ledger import Ledger
from django_cluster_jobs.observe.probes import ProbeServer
from tests import timing
from tests.conftest import wait_until
from tests.timing import scaled

pytestmark = pytest.mark.django_db(transaction=True)

#: Quick heartbeats and a short stall window, so an outage and a stuck loop show within seconds
#: (on the suite's time scale).
FAST = {
    "HEARTBEAT_INTERVAL": scaled(0.2),
    "DEAD_AFTER": scaled(1.5),
    "LEASE_TTL": scaled(3.0),
    "LEADER_TTL": scaled(2.0),
    "GRACE_PERIOD": scaled(1.0),
    "CLOCK": None,
}
#: The node's probe server answers one GET (it reads memory only).
PROBE_ANSWERS = scaled(10)
#: How often the outage test asks for liveness while it watches.
ASK_EVERY = scaled(0.1)
#: A tick the test blocks is released by the test long before this (a hang guard).
BLOCKED_AT_MOST = scaled(60)


class OutageVendor:
    """Delegates to the real vendor; the heartbeat raises while ``down`` is set."""

    def __init__(self) -> None:
        self.real = get_vendor()
        self.down = False

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def heartbeat(self, *args, **kwargs):
        if self.down:
            raise OperationalError("could not connect to server: Connection refused")
        return self.real.heartbeat(*args, **kwargs)


def ask(server: ProbeServer, path: str) -> tuple[int, dict | str]:
    """GET ``path`` from the probe server: (status, JSON body or text)."""
    url = f"http://127.0.0.1:{server.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=PROBE_ANSWERS) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read().decode()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


@pytest.fixture
def cluster_settings() -> Iterator[None]:
    with override_settings(CLUSTER_JOBS=FAST):
        yield


@pytest.fixture
def node(cluster_settings) -> Iterator[Node]:
    node = Node("probed", ledger=Ledger(OutageVendor()), threads=2)
    yield node
    node.request_stop(reason="test over")


@pytest.fixture
def probes(node) -> Iterator[ProbeServer]:
    server = ProbeServer(node.health, 0, host="127.0.0.1")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def running(node, probes) -> Iterator[Node]:
    """The node's loop on a thread of its own, as runscheduler runs it; stopped at teardown."""

    def loop_thread() -> None:
        try:
            node.run(duration=timing.PROCESS_LIFE)
        finally:
            connections.close_all()  # this thread's own connection

    loop = threading.Thread(target=loop_thread, daemon=True)
    loop.start()
    wait_until(lambda: ask(probes, "/startupz")[0] == 200, timeout=timing.NODE_START)
    yield node
    node.request_stop(reason="test over")
    loop.join(timeout=timing.NODE_EXIT)
    assert not loop.is_alive()


def test_before_start_only_startup_fails_and_readiness_waits(node, probes):
    assert ask(probes, "/startupz") == (503, {"status": "failing", "checks": {"started": False}})
    status, body = ask(probes, "/readyz")
    assert status == 503 and body["checks"]["started"] is False
    assert ask(probes, "/livez")[0] == 200  # liveness waits for the startup probe


@pytest.mark.timing
def test_a_started_node_is_live_ready_and_started(running, probes):
    assert ask(probes, "/startupz") == (200, {"status": "ok", "checks": {"started": True}})
    assert ask(probes, "/livez") == (
        200,
        {"status": "ok", "checks": {"loop": True, "heartbeat": True}},
    )
    assert ask(probes, "/readyz") == (200, {"status": "ok", "checks": {
        "started": True, "database": True, "definitions": True, "not_draining": True,
    }})  # fmt: skip
    assert ask(probes, "/nowhere")[0] == 404
    assert ask(probes, "/metrics")[0] == 404  # no metrics were given to this server


@pytest.mark.timing
def test_a_database_outage_fails_readiness_but_never_liveness(running, probes):
    running.ledger.vendor.down = True
    _, body = wait_until(lambda: (answer := ask(probes, "/readyz"))[0] == 503 and answer,
                         timeout=timing.REACT)  # fmt: skip
    assert body["checks"]["database"] is False and body["checks"]["not_draining"] is True
    # Live through the outage, for longer than the stall window itself.
    deadline = time.monotonic() + 2 * FAST["DEAD_AFTER"]
    while time.monotonic() < deadline:
        assert ask(probes, "/livez")[0] == 200
        timing.pause(ASK_EVERY)
    assert ask(probes, "/readyz")[0] == 503
    running.ledger.vendor.down = False
    wait_until(lambda: ask(probes, "/readyz")[0] == 200, timeout=timing.REACT)


@pytest.mark.timing
def test_a_stuck_loop_fails_liveness(running, probes):
    release = threading.Event()
    stuck = threading.Event()

    def blocked_tick(now):
        stuck.set()
        release.wait(BLOCKED_AT_MOST)

    # The tick that blocks begins after this instant: the loop was live until then at least.
    before = time.monotonic()
    running.claimer.tick = blocked_tick
    running.wake.set()
    try:
        assert stuck.wait(timing.REACT)
        _, body = wait_until(
            lambda: (answer := ask(probes, "/livez"))[0] == 503 and answer,
            timeout=FAST["DEAD_AFTER"] + timing.REACT,
        )
        assert body["checks"] == {"loop": False, "heartbeat": True}
        # Not before the stall window has passed since the tick began.
        assert time.monotonic() - before >= FAST["DEAD_AFTER"]
    finally:
        release.set()
    wait_until(lambda: ask(probes, "/livez")[0] == 200, timeout=timing.REACT)


@pytest.mark.timing
def test_a_draining_node_is_not_ready_but_still_live(running, probes):
    assert services.request_drain([running.node_id]) == 1

    def drained():  # another check may fail meanwhile on a loaded host: wait for this one
        answer = ask(probes, "/readyz")
        return answer[0] == 503 and answer[1]["checks"]["not_draining"] is False and answer

    _, body = wait_until(drained, timeout=timing.REACT)
    assert body["checks"]["not_draining"] is False
    assert ask(probes, "/livez")[0] == 200


def test_runscheduler_refuses_a_port_out_of_range():
    with pytest.raises(CommandError, match="must be a TCP port"):
        call_command("runscheduler", "--once", "--probe-port", "70000")

"""Presence: how a node tells that a peer's process ended, and who watches whom."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from django_cluster_jobs.coordination.types import LeaseSeen, Peer, lease_seen, peers_of
from django_cluster_jobs.engine.presence import process_alive, process_token, successor
from tests import timing


def test_this_process_is_alive_by_its_token():
    assert process_alive(process_token()) is True


def test_two_registrations_of_one_process_differ():
    assert process_token() != process_token()


def test_an_ended_process_is_dead_by_its_token():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        host, scope, _, _, rand = process_token().split("|")
        stat = Path(f"/proc/{child.pid}/stat").read_text()
        token = f"{host}|{scope}|{child.pid}|{stat.rsplit(')', 1)[1].split()[19]}|{rand}"
        assert process_alive(token) is True
        child.kill()
        # Wait for its end without reaping it: a zombie, which counts as ended at once.
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert process_alive(token) is False
        child.wait(timeout=timing.NODE_EXIT)  # a hang guard: it has ended, this reaps it
        assert process_alive(token) is False
    finally:
        child.kill()
        child.wait(timeout=timing.NODE_EXIT)


def test_a_reused_process_id_is_told_apart_by_its_start_time():
    host, scope, pid, started, rand = process_token().split("|")
    assert process_alive(f"{host}|{scope}|{pid}|{int(started) + 1}|{rand}") is False


def test_what_cannot_be_judged_is_left_to_the_lease():
    host, scope, pid, started, rand = process_token().split("|")
    other_host = f"{host}|someone-else/1|{pid}|{started}|{rand}"
    for token in ("", "garbage", other_host, f"{host}||{pid}||{rand}", f"{host}|{scope}|x|1|r"):
        assert process_alive(token) is None, token
    assert os.getpid() == int(pid)


def test_peers_are_read_from_either_form_and_nothing_else():
    beat = datetime(2026, 12, 1, 12, 0, 0, 250000, tzinfo=UTC)
    rows = [[1, "a", "t1", "2026-12-01T12:00:00.25+00:00"], [2, "b", None, None]]
    expected = (Peer(1, "a", "t1", beat), Peer(2, "b", "", None))
    assert peers_of(rows) == expected
    assert peers_of(rows)[0].last_heartbeat == beat
    sqlite = '[[1, "a", "t1", "2026-12-01 12:00:00.250000"], [2, "b", null, null]]'
    assert peers_of(sqlite) == expected and peers_of(sqlite)[0].last_heartbeat == beat
    for junk in (None, "not json", "{}", 5, [[1, 2, 3]], [["1", "a", "t", None]]):
        assert peers_of(junk) == ()


def test_the_leader_lease_is_read_from_either_form():
    until = datetime(2026, 12, 1, 12, 0, 15, tzinfo=UTC)
    assert lease_seen(["n1", "2026-12-01T12:00:15+00:00"]) == LeaseSeen("n1", until)
    assert lease_seen('["n1", "2026-12-01 12:00:15"]') == LeaseSeen("n1", until)
    assert lease_seen(["", None]) == LeaseSeen("", None)
    assert LeaseSeen("", None).free(until) and LeaseSeen("n1", until).free(until)
    assert not LeaseSeen("n1", until).free(until - timedelta(seconds=1))
    for junk in (None, "x", [1], {}):
        assert lease_seen(junk) is None


@given(st.sets(st.integers(min_value=1, max_value=10_000), min_size=1, max_size=30))
def test_the_ring_watches_every_node_exactly_once(pks):
    peers = [Peer(pk, f"n{pk}", "") for pk in pks]
    watched = [successor(peers, pk) for pk in pks]
    if len(pks) == 1:
        assert watched == [None]
        return
    assert all(w is not None for w in watched)
    assert sorted(w.pk for w in watched) == sorted(pks)  # each watched by exactly one peer
    assert all(w.pk != pk for w, pk in zip(watched, pks, strict=True))


def test_a_node_missing_from_the_list_still_watches_the_next():
    peers = [Peer(5, "e", ""), Peer(9, "i", "")]
    assert successor(peers, 7) == Peer(9, "i", "")
    assert successor(peers, 10) == Peer(5, "e", "")
    assert successor(peers, None) is None

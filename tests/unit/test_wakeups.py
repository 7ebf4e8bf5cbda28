"""Which nodes a pending notification wakes (engine.wakeups): as many as its runs fill, each
exactly once, passed on to the next nodes when a woken one is busy, and every node when the
notification counts nothing or a node's view is behind."""

from __future__ import annotations

import pytest

from django_cluster_jobs.engine.wakeups import Wake, parse, passed_on, share, width

LIVE = ("a", "b", "c", "d")
THREADS = 4


def shares(wake: Wake | None, live=LIVE, threads=THREADS) -> dict[str, int]:
    return {node: share(wake, live, node, threads) for node in live}


@pytest.mark.parametrize(
    ("payload", "pid", "wake"),
    [
        ("1", 77, Wake(1, 77)),
        ("12", 5, Wake(12, 5)),
        ("3 2 1", 9, Wake(3, 2, 1)),
        ("", 9, None),  # a release or a retry: nobody counted
        ("0", 9, None),
        ("x", 9, None),
        ("1 2", 9, None),
        ("1 -1 0", 9, None),
    ],
)
def test_a_payload_reads_as_its_wake_up(payload, pid, wake):
    assert parse(payload, pid) == wake


def test_one_run_wakes_one_node_and_which_one_follows_the_sender():
    for pid in range(8):
        woken = {node: n for node, n in shares(Wake(1, pid)).items() if n}
        assert woken == {LIVE[pid % 4]: 1}


@pytest.mark.parametrize(("count", "nodes"), [(4, 1), (5, 2), (8, 2), (9, 3), (16, 4), (99, 4)])
def test_a_batch_wakes_as_many_nodes_as_its_runs_fill(count, nodes):
    got = shares(Wake(count, 1))
    assert sum(1 for n in got.values() if n) == nodes == width(Wake(count, 1), 4, THREADS)
    assert sum(got.values()) == min(count, 4 * THREADS)
    assert {node for node, n in got.items() if n} == {LIVE[(1 + i) % 4] for i in range(nodes)}


def test_every_node_looks_when_the_notification_counts_nothing_or_its_view_is_behind():
    assert shares(None) == dict.fromkeys(LIVE, THREADS)
    assert share(Wake(1, 0), ("a", "b"), "new", THREADS) == THREADS  # not yet in its own view
    assert share(Wake(1, 0), (), "a", THREADS) == THREADS  # before its first heartbeat


def test_a_busy_node_passes_its_share_on_to_each_other_node_once_then_stops():
    wake, asked = Wake(1, 0), []
    while wake is not None:
        [node] = [node for node, n in shares(wake).items() if n]
        asked.append(node)
        wake = passed_on(wake, short=1, nodes=4, threads=THREADS)
    assert asked == ["a", "b", "c", "d"]


def test_what_a_woken_node_took_is_not_passed_on():
    assert passed_on(Wake(3, 0), short=0, nodes=4, threads=THREADS) is None
    onward = passed_on(Wake(8, 1), short=2, nodes=4, threads=THREADS)  # woke b and c
    assert onward == Wake(2, 3, 2)
    assert [node for node, n in shares(onward).items() if n] == ["d"]


def test_the_order_is_the_same_whatever_order_a_node_read_the_others_in():
    shuffled = ("c", "a", "d", "b")
    assert shares(Wake(1, 6), live=shuffled) == {
        node: share(Wake(1, 6), LIVE, node, THREADS) for node in shuffled
    }

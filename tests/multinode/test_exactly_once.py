"""delivery="exactly_once" under real scheduler processes that are killed mid-handler.

Three nodes serve runs of ``tests.effects_slow`` (a row, 0.4 s of work, a second row, in the
run's transaction); nodes are SIGKILLed while they run them and started again. Whatever attempt
a kill cuts, every run ends with exactly one pair of rows, from the attempt that succeeded:
never one row, never two pairs.
"""

from __future__ import annotations

from functools import partial

import pytest

from django_cluster_jobs import services
from django_cluster_jobs.models import JobRun, RunState, WorkerNode
from tests import timing
from tests.conftest import wait_until
from tests.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

SERVES = f"{timing.PROCESS_LIFE - timing.NODE_START - timing.NODE_EXIT:g}"
RUNS = 40
KILLS = 4


#: What busy() answers once every run has ended: nothing is left to kill a node in.
DONE = "-"


def busy(keys: list[str], names: list[str]) -> str | None:
    """A node among ``names`` that runs one of the runs ``keys``; DONE once none is left to
    run; None meanwhile."""
    runs = JobRun.objects.filter(key__in=keys)
    if node := runs.filter(state=RunState.RUNNING, node__in=names).values_list("node").first():
        return node[0]
    return None if runs.filter(state__in=(RunState.PENDING, RunState.RUNNING)).exists() else DONE


def test_killed_nodes_leave_each_run_one_pair_of_rows(start_scheduler):
    nodes = {n: start_scheduler(n, "--duration", SERVES) for n in ("a", "b", "c")}
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 3, timing.NODE_START)
    runs = [services.enqueue("tests.effects_slow") for _ in range(RUNS)]
    keys = [run.key for run in runs]
    killed = 0
    for round_ in range(KILLS):
        # A node in the middle of an attempt (its transaction open, or about to be).
        victim = wait_until(partial(busy, keys, list(nodes)), timing.RUN_ENDS)
        if victim == DONE:
            break
        nodes[victim].kill()
        killed += 1
        nodes[f"{victim}{round_}"] = start_scheduler(f"{victim}{round_}", "--duration", SERVES)
        del nodes[victim]
    live = (RunState.PENDING, RunState.RUNNING)
    ended = JobRun.objects.filter(key__in=keys).exclude(state__in=live)
    wait_until(lambda: ended.count() == RUNS, timing.RUN_ENDS * 4)
    assert killed >= 1
    for run in JobRun.objects.filter(key__in=keys):
        rows = list(Effect.objects.filter(key=run.key).values_list("attempt", flat=True))
        assert run.state == RunState.SUCCEEDED, (run.key, run.state, run.error)
        assert rows == [run.attempt, run.attempt], (run.key, run.attempt, rows)

"""Dependencies across real runscheduler processes: fan-out, fan-in, failure and replay, and a
node killed in the middle of an instance. Each dependent runs exactly once per instance."""

from __future__ import annotations

import signal

import pytest

from django_cluster_jobs import services
from django_cluster_jobs.models import LIVE_STATES, Cause, JobRun, RunState, WorkerNode
from tests import timing
from tests.conftest import wait_until
from tests.models import Effect
from tests.multinode.test_faults import LONG_LEASE, SERVES, TAKEOVER_DEADLINE, needs_presence

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

BRANCHES = ("tests.flow_b", "tests.flow_c")
DEPENDENTS = (*BRANCHES, "tests.flow_d")
#: The steps left of instances all end: two steps at most (the branches, then tests.flow_d),
#: each a run that works a few seconds at most (the branches wait for each other up to 5 s).
INSTANCES_END = 2 * timing.RUN_ENDS


def instance_runs(instance: int) -> dict[str, JobRun]:
    runs = JobRun.objects.filter(instance=instance).select_related("job")
    return {run.job.name: run for run in runs}


def ledger(instance: int) -> str:
    rows = JobRun.objects.in_instance(instance).values_list(
        "job__name", "key", "state", "node", "attempt", "reason"
    )
    return "\n".join(" ".join(map(str, row)) for row in rows)


def ended(instance: int, name: str) -> JobRun | None:
    """The run of ``name`` in the instance once it has ended; None while it waits or runs."""
    run = instance_runs(instance).get(name)
    return run if run is not None and run.state not in LIVE_STATES else None


def completed(instance: int) -> bool:
    d = instance_runs(instance).get("tests.flow_d")
    return d is not None and d.state == RunState.SUCCEEDED


def executions(name: str, instance: int) -> int:
    return Effect.objects.filter(job=name, key=f"after:{instance}").count()


def three_nodes(start_scheduler, **env):
    nodes = {n: start_scheduler(n, "--duration", SERVES, **env) for n in ("n0", "n1", "n2")}
    active = WorkerNode.objects.filter(status="active")
    wait_until(lambda: active.count() == 3, timing.NODE_START)
    return nodes


def stop(nodes) -> None:
    for node in nodes.values():
        node.signal(signal.SIGTERM)
    for node in nodes.values():
        assert node.wait(timeout=timing.NODE_EXIT) == 0, node.output()


def test_fan_out_and_fan_in_across_three_nodes_once_per_instance(start_scheduler):
    nodes = three_nodes(start_scheduler, jobs="flow")
    roots = JobRun.objects.filter(job__name="tests.flow_root", state=RunState.SUCCEEDED)
    wait_until(lambda: roots.count() >= 6, timing.FEW_SECONDS_OF_RUNS)
    services.set_enabled(["tests.flow_root"], enabled=False, by="test")
    live = JobRun.objects.filter(job__name="tests.flow_root", state__in=LIVE_STATES)
    wait_until(lambda: not live.exists(), timing.RUN_ENDS)
    instances = list(roots.values_list("pk", flat=True))
    wait_until(lambda: all(completed(i) for i in instances), INSTANCES_END)
    stop(nodes)
    for instance in instances:
        runs = instance_runs(instance)
        assert set(runs) == set(DEPENDENTS), ledger(instance)
        for name in DEPENDENTS:
            assert executions(name, instance) == 1, ledger(instance)
            assert runs[name].state == RunState.SUCCEEDED, ledger(instance)
        b, c, d = (runs[name] for name in DEPENDENTS)
        # The branches ran at the same time, and d started only after both had ended.
        assert b.started_at < c.finished_at and c.started_at < b.finished_at, ledger(instance)
        assert d.started_at >= max(b.finished_at, c.finished_at), ledger(instance)


def test_a_failed_predecessor_skips_its_dependent_and_a_replay_resumes_it(start_scheduler):
    nodes = three_nodes(start_scheduler)
    Effect.objects.create(job="fail:tests.flow_c", key="", node="")
    root = services.enqueue("tests.flow_root")
    d = wait_until(lambda: ended(root.pk, "tests.flow_d"), timing.RUN_ENDS)
    c = instance_runs(root.pk)["tests.flow_c"]
    assert d.state == RunState.SKIPPED, ledger(root.pk)
    assert c.state == RunState.FAILED, ledger(root.pk)
    assert (d.cause, d.origin_id) == (Cause.UPSTREAM, c.pk), ledger(root.pk)
    assert "predecessor tests.flow_c ended failed" in d.reason
    # d is skipped as soon as c fails; nothing orders b's end before that.
    b = wait_until(lambda: ended(root.pk, "tests.flow_b"), timing.RUN_ENDS)
    assert b.state == RunState.SUCCEEDED, ledger(root.pk)
    Effect.objects.filter(job="fail:tests.flow_c").delete()
    replay = services.replay(c, by="admin:operator")
    wait_until(lambda: completed(root.pk), INSTANCES_END)
    stop(nodes)
    assert JobRun.objects.get(pk=replay.pk).state == RunState.SUCCEEDED
    assert executions("tests.flow_d", root.pk) == 1, ledger(root.pk)
    assert JobRun.objects.filter(job__name="tests.flow_d").count() == 1


@needs_presence  # the takeover within LONG_LEASE, with cause node_lost, comes from presence
def test_a_node_killed_mid_instance_has_its_run_taken_over_and_the_instance_ends(
    start_scheduler,
):
    nodes = three_nodes(start_scheduler, CLUSTER_JOBS_TEST_LONG="3", **LONG_LEASE)
    root = services.enqueue("tests.flow_root")

    def b_running() -> str | None:
        b = instance_runs(root.pk).get("tests.flow_b")
        started = b is not None and b.state == RunState.RUNNING
        return (
            b.node
            if started and Effect.objects.filter(job=b.job.name, node=b.node).exists()
            else None
        )

    owner = wait_until(b_running, timing.RUN_ENDS)  # the root runs, then b starts
    nodes[owner].kill()
    retaken = JobRun.objects.filter(instance=root.pk, job__name="tests.flow_b", attempt=2)
    wait_until(retaken.exists, TAKEOVER_DEADLINE)
    wait_until(lambda: completed(root.pk), INSTANCES_END)
    runs = instance_runs(root.pk)
    assert runs["tests.flow_b"].attempt == 2 and runs["tests.flow_b"].node != owner, ledger(root.pk)
    assert runs["tests.flow_b"].cause == Cause.NODE_LOST, ledger(root.pk)
    assert executions("tests.flow_d", root.pk) == 1, ledger(root.pk)
    assert runs["tests.flow_d"].node != owner
    del nodes[owner]
    stop(nodes)

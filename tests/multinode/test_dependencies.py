"""Dependencies across real runscheduler processes: fan-out, fan-in, failure and replay, and a
node killed in the middle of an instance. Each dependent runs exactly once per instance."""

from __future__ import annotations

import signal

import pytest

from django_cluster_jobs import services
from django_cluster_jobs.models import Cause, JobRun, RunState, WorkerNode
from tests.conftest import wait_until
from tests.models import Effect
from tests.multinode.test_faults import needs_presence

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multinode]

BRANCHES = ("tests.flow_b", "tests.flow_c")
DEPENDENTS = (*BRANCHES, "tests.flow_d")
#: A lease far longer than any deadline below: a takeover within it came from presence.
LONG_LEASE = {"CLUSTER_JOBS_LEASE_TTL": "60", "CLUSTER_JOBS_DEAD_AFTER": "60"}


def instance_runs(instance: int) -> dict[str, JobRun]:
    runs = JobRun.objects.filter(instance=instance).select_related("job")
    return {run.job.name: run for run in runs}


def ledger(instance: int) -> str:
    rows = JobRun.objects.in_instance(instance).values_list(
        "job__name", "key", "state", "node", "attempt", "reason"
    )
    return "\n".join(" ".join(map(str, row)) for row in rows)


def completed(instance: int) -> bool:
    d = instance_runs(instance).get("tests.flow_d")
    return d is not None and d.state == RunState.SUCCEEDED


def executions(name: str, instance: int) -> int:
    return Effect.objects.filter(job=name, key=f"after:{instance}").count()


def three_nodes(start_scheduler, **env):
    nodes = {n: start_scheduler(n, "--duration", "60", **env) for n in ("n0", "n1", "n2")}
    wait_until(lambda: WorkerNode.objects.filter(status="active").count() == 3, 30)
    return nodes


def stop(nodes) -> None:
    for node in nodes.values():
        node.signal(signal.SIGTERM)
    for node in nodes.values():
        assert node.wait(timeout=30) == 0, node.output()


def test_fan_out_and_fan_in_across_three_nodes_once_per_instance(start_scheduler):
    nodes = three_nodes(start_scheduler, jobs="flow")
    roots = JobRun.objects.filter(job__name="tests.flow_root", state=RunState.SUCCEEDED)
    wait_until(lambda: roots.count() >= 6, 40)
    services.set_enabled(["tests.flow_root"], enabled=False, by="test")
    live = JobRun.objects.filter(job__name="tests.flow_root", state__in=("pending", "running"))
    wait_until(lambda: not live.exists(), 10)
    instances = list(roots.values_list("pk", flat=True))
    wait_until(lambda: all(completed(i) for i in instances), 40)
    stop(nodes)
    nodes_used = set()
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
        nodes_used |= {b.node, c.node, d.node}
    assert len(nodes_used) >= 2, "one node ran every dependent"


def test_a_failed_predecessor_skips_its_dependent_and_a_replay_resumes_it(start_scheduler):
    nodes = three_nodes(start_scheduler)
    Effect.objects.create(job="fail:tests.flow_c", key="", node="")
    root = services.enqueue("tests.flow_root")
    skipped = lambda: instance_runs(root.pk).get("tests.flow_d")  # noqa: E731
    d = wait_until(lambda: (run := skipped()) and run.state == RunState.SKIPPED and run, 30)
    c = instance_runs(root.pk)["tests.flow_c"]
    assert c.state == RunState.FAILED, ledger(root.pk)
    assert (d.cause, d.origin_id) == (Cause.UPSTREAM, c.pk), ledger(root.pk)
    assert "predecessor tests.flow_c ended failed" in d.reason
    assert instance_runs(root.pk)["tests.flow_b"].state == RunState.SUCCEEDED
    Effect.objects.filter(job="fail:tests.flow_c").delete()
    replay = services.replay(c, by="admin:operator")
    wait_until(lambda: completed(root.pk), 30)
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

    owner = wait_until(b_running, 30)
    nodes[owner].kill()
    wait_until(lambda: completed(root.pk), 40)
    runs = instance_runs(root.pk)
    assert runs["tests.flow_b"].attempt == 2 and runs["tests.flow_b"].node != owner, ledger(root.pk)
    assert runs["tests.flow_b"].cause == Cause.NODE_LOST, ledger(root.pk)
    assert executions("tests.flow_d", root.pk) == 1, ledger(root.pk)
    assert runs["tests.flow_d"].node != owner
    del nodes[owner]
    stop(nodes)

"""Dependencies in the ledger: a run's end queues or skips its dependents in the same
transaction, once per (job, instance), on the vendor's path and the portable one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_cluster_jobs import services
from django_cluster_jobs.coordination import Won
from django_cluster_jobs.models import Cause, EventKind, JobRun, Outcome, RunEvent, RunState
from tests.races import race

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 5, 28, 9, 0, tzinfo=UTC)
FLOW = ("tests.flow_root", "tests.flow_b", "tests.flow_c", "tests.flow_d")


@pytest.fixture(autouse=True)
def definitions():
    """The workflow's definitions, as a node stores them from code."""
    return {name: services.definition_for(name) for name in FLOW}


def running(name: str, instance: int | None = None, key: str | None = None) -> JobRun:
    """A run of ``name`` this test's node holds (fence 1)."""
    job = services.definition_for(name)
    key = key or f"test:{name}:{instance}:{JobRun.objects.count()}"
    return JobRun.objects.create(
        job=job, key=key, scheduled_at=NOW, due_at=NOW, state=RunState.RUNNING, node="n",
        lease_expires_at=NOW + timedelta(minutes=1), instance=instance, created_at=NOW,
    )  # fmt: skip


def won(run: JobRun) -> Won:
    return Won(run.pk, run.job_id, run.key, run.fence, run.attempt)


def end(ledger, run: JobRun, state: str = RunState.SUCCEEDED) -> bool:
    return ledger.runs.finish(won(run), "n", state, NOW, leads=True)


def step(name: str, instance: int) -> JobRun | None:
    return JobRun.objects.filter(job__name=name, instance=instance).first()


def take(run: JobRun) -> JobRun:
    """The pending dependent, as a node's taker would start it."""
    JobRun.objects.filter(pk=run.pk).update(state=RunState.RUNNING, node="n")
    run.refresh_from_db()
    return run


def test_a_root_success_queues_its_dependents_in_its_instance(ledger):
    root = running("tests.flow_root")
    assert end(ledger, root)
    for name in ("tests.flow_b", "tests.flow_c"):
        run = step(name, root.pk)
        assert run is not None, name
        assert (run.state, run.outcome, run.key, run.origin_id) == (
            RunState.PENDING, Outcome.AFTER, f"after:{root.pk}", root.pk,
        )  # fmt: skip
        assert run.pending_rank is not None
    assert step("tests.flow_d", root.pk) is None  # it waits for both


def test_a_dependent_is_queued_once_when_its_last_predecessor_succeeds(ledger):
    root = running("tests.flow_root")
    end(ledger, root)
    end(ledger, take(step("tests.flow_b", root.pk)))
    assert step("tests.flow_d", root.pk) is None
    end(ledger, take(step("tests.flow_c", root.pk)))
    [d] = JobRun.objects.filter(job__name="tests.flow_d")
    assert (d.instance, d.state, d.key) == (root.pk, RunState.PENDING, f"after:{root.pk}")
    again = running("tests.flow_b", root.pk)  # a second success of b in the instance
    end(ledger, again)
    assert JobRun.objects.filter(job__name="tests.flow_d").count() == 1


def test_dependencies_are_satisfied_per_instance_never_across(ledger):
    first, second = running("tests.flow_root"), running("tests.flow_root")
    end(ledger, first)
    end(ledger, second)
    end(ledger, take(step("tests.flow_b", first.pk)))
    end(ledger, take(step("tests.flow_c", second.pk)))
    assert not JobRun.objects.filter(job__name="tests.flow_d").exists()


def test_predecessors_ending_at_once_queue_the_dependent_exactly_once(ledger):
    for _ in range(5):
        root = running("tests.flow_root")
        end(ledger, root)
        branches = [take(step(name, root.pk)) for name in ("tests.flow_b", "tests.flow_c")]
        assert all(race(2, lambda i, runs=branches: end(ledger, runs[i])))
        runs = JobRun.objects.filter(job__name="tests.flow_d", instance=root.pk)
        assert runs.count() == 1, list(runs.values_list("key", "state"))


def test_a_failure_for_good_skips_the_dependents_naming_the_predecessor(ledger):
    root = running("tests.flow_root")
    end(ledger, root)
    end(ledger, take(step("tests.flow_b", root.pk)))
    c = take(step("tests.flow_c", root.pk))
    end(ledger, c, RunState.DEAD)
    d = step("tests.flow_d", root.pk)
    assert (d.state, d.cause, d.origin_id, d.outcome) == (
        RunState.SKIPPED, Cause.UPSTREAM, c.pk, Outcome.AFTER,
    )  # fmt: skip
    assert d.reason == f"predecessor tests.flow_c ended dead (run {c.pk})"
    assert RunEvent.objects.filter(run=d, kind=EventKind.SKIPPED).count() == 1


def test_a_failed_root_skips_the_whole_graph_down_to_the_last_job(ledger):
    root = running("tests.flow_root")
    end(ledger, root, RunState.FAILED)
    states = dict(JobRun.objects.filter(instance=root.pk).values_list("job__name", "state"))
    assert states == {name: RunState.SKIPPED for name in FLOW[1:]}


def test_replaying_the_failed_predecessor_resumes_the_instance(ledger):
    root = running("tests.flow_root")
    end(ledger, root)
    end(ledger, take(step("tests.flow_b", root.pk)))
    c = take(step("tests.flow_c", root.pk))
    end(ledger, c, RunState.DEAD)
    replay = services.replay(JobRun.objects.get(pk=c.pk), by="admin:op")
    assert replay.instance == root.pk
    end(ledger, take(replay))
    [d] = JobRun.objects.filter(job__name="tests.flow_d")
    assert (d.state, d.instance, d.origin_id) == (RunState.PENDING, root.pk, replay.pk)
    assert d.finished_at is None and d.pending_rank is not None


def test_replaying_a_failed_root_resumes_its_own_instance(ledger):
    root = running("tests.flow_root")
    end(ledger, root, RunState.DEAD)
    replay = services.replay(JobRun.objects.get(pk=root.pk))
    assert replay.instance == root.pk
    end(ledger, take(replay))
    states = dict(JobRun.objects.filter(instance=root.pk, outcome=Outcome.AFTER)
                  .values_list("job__name", "state"))  # fmt: skip
    assert states == {
        "tests.flow_b": RunState.PENDING,
        "tests.flow_c": RunState.PENDING,
        "tests.flow_d": RunState.SKIPPED,  # b and c have not run yet in the resumed instance
    }


def test_a_replay_outside_a_workflow_belongs_to_no_instance(ledger):
    run = running("tests.manual")
    ledger.runs.finish(won(run), "n", RunState.FAILED, NOW)
    assert services.replay(JobRun.objects.get(pk=run.pk)).instance is None


def test_a_run_lost_at_most_once_skips_its_dependents(ledger):
    root = running("tests.flow_root")
    end(ledger, root)
    b = take(step("tests.flow_b", root.pk))
    state = ledger.runs.release(b.pk, b.fence, "leader", NOW, Cause.NODE_LOST, "gone",
                                "at_most_once")  # fmt: skip
    assert state == RunState.LOST
    assert step("tests.flow_d", root.pk).state == RunState.SKIPPED


def test_a_fenced_out_end_decides_nothing(ledger):
    root = running("tests.flow_root")
    stale = Won(root.pk, root.job_id, root.key, root.fence - 1, 1)
    assert not ledger.runs.finish(stale, "n", RunState.SUCCEEDED, NOW, leads=True)
    assert not JobRun.objects.filter(instance=root.pk).exists()

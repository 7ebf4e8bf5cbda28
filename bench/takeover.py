"""Time from a node's death (SIGKILL) to another node taking over its run, default settings.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/benchdb python bench/takeover.py

Each trial starts 2 ``runscheduler`` processes, a random part of a heartbeat apart, with the
library defaults (lease 15 s, heartbeat 5 s, leader lease 15 s, dead after 60 s), enqueues the
long job ``bench.long``, SIGKILLs the node running it at a random moment 2-7 s after it started
(so the kill falls anywhere between two heartbeats), and waits for the run's ``taken_over``
event. The script starts no new trial when fewer than 60 s remain of its --budget.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import common  # noqa: E402

#: Seconds the killed node runs the job before it is killed, plus up to one heartbeat interval.
RUNNING_BEFORE_KILL = 2.0
HEARTBEAT_INTERVAL = 5.0  # the library default, which bench.settings keeps


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--budget", type=float, default=140.0, help="seconds for all trials")
    return parser.parse_args()


def leader() -> str:
    from django_cluster_jobs.models import Lease

    return Lease.objects.filter(name="leader").values_list("holder", flat=True).first() or ""


def running(run_id: int):
    from django_cluster_jobs.models import JobRun

    return JobRun.objects.filter(pk=run_id, state="running").exclude(node="").first()


def taken_over(run_id: int):
    from django_cluster_jobs.models import RunEvent

    return RunEvent.objects.filter(run_id=run_id, kind="taken_over").first()


def trial(number: int) -> dict | None:
    """One kill and takeover; return the figures in seconds after the kill, or None."""
    common.wipe()
    nodes = {}
    try:
        for name in (f"t{number}a", f"t{number}b"):
            # Started a random fraction of a heartbeat apart, as nodes of a real deployment are:
            # the takeover waits for the leader's first heartbeat after the lease expired.
            time.sleep(random.uniform(0, HEARTBEAT_INTERVAL))
            nodes[name] = common.Scheduler(
                name, "--duration", "170", log_name="takeover", BENCH_LONG="90"
            )
        return kill_owner(number, nodes)
    finally:
        common.reap(nodes.values())  # the survivor runs the 90 s job: no graceful drain


def kill_owner(number: int, nodes: dict[str, common.Scheduler]) -> dict | None:
    """Enqueue the long job, SIGKILL the node that runs it, wait for the takeover."""
    from django.utils import timezone

    from django_cluster_jobs.services import enqueue

    if not common.wait_for(leader, 30):
        return None
    time.sleep(1.0)  # the second node registers and opens its LISTEN connection
    run_id = enqueue("bench.long").pk
    run = common.wait_for(lambda: running(run_id), 15)
    if run is None:
        return None
    time.sleep(RUNNING_BEFORE_KILL + random.uniform(0, HEARTBEAT_INTERVAL))
    run.refresh_from_db()
    role = "leader" if leader() == run.node else "not leader"
    killed = timezone.now()
    nodes[run.node].signal(signal.SIGKILL)
    event = common.wait_for(lambda: taken_over(run_id), 75, 0.02)
    return figures(number, run, role, killed, event)


def figures(number: int, run, role: str, killed, event) -> dict:
    from django_cluster_jobs.models import RunEvent

    expired = (
        RunEvent.objects.filter(run_id=run.pk, kind__in=("expired", "node_lost"), at__gte=killed)
        .values_list("at", flat=True)
        .first()
    )

    def after(moment) -> float:
        return (moment - killed).total_seconds() if moment else float("nan")

    return {
        "trial": number,
        "owner": f"{run.node} ({role}) -> {event.node if event else 'nobody'}",
        "lease left": after(run.lease_expires_at),
        "released": after(expired),
        "taken over": after(event.at if event else None),
        "pickup": common.ms((event.at - expired).total_seconds()) if event and expired else "-",
    }


def main() -> None:
    args = arguments()
    common.setup()
    common.header(
        "takeover.py",
        "SIGKILL of the node running a job -> another node takes the run over; "
        "library defaults (lease 15 s, heartbeat 5 s, leader lease 15 s)",
    )
    deadline = time.monotonic() + args.budget
    results = []
    for number in range(1, args.trials + 1):
        if deadline - time.monotonic() < 60:
            common.note(f"trial {number} not started: under 60 s of the budget left")
            break
        result = trial(number)
        if result is None:
            common.note(f"trial {number} failed to start; see {common.WORK / 'logs'}")
            continue
        results.append(result)
    print()
    headers = [
        "trial",
        "killed -> new owner",
        "lease left s",
        "released s",
        "taken over s",
        "pickup ms",
    ]
    keys = ["trial", "owner", "lease left", "released", "taken over", "pickup"]
    common.table(headers, [[r[k] for k in keys] for r in results])
    common.note(
        "seconds after the SIGKILL: 'lease left' = the run's lease_expires_at at the kill; "
        "'released' = the run's release (node_lost by presence, or lease expired); 'taken over' = "
        "the new owner's "
        "taken_over event; 'pickup' = released -> taken over (NOTIFY on PostgreSQL, polling "
        "every POLL_INTERVAL elsewhere)."
    )
    common.note(f"load at the end: {common.load()}; other test suites share this machine")


if __name__ == "__main__":
    main()

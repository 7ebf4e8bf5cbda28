"""``manage.py demosummary``: the demo's runs per job and per node, read from the ledger."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count
from django.utils.dateparse import parse_datetime

from django_cluster_jobs.models import JobRun, RunState

#: Rows for occurrences that did not run: they belong to no node.
NOT_RUN = (RunState.MISSED, RunState.SKIPPED)


def aware_datetime(text: str) -> datetime:
    value = parse_datetime(text)
    if value is None or value.tzinfo is None:
        raise ValueError(f"not an ISO 8601 date-time with a time zone: {text!r}")
    return value


def missing_seconds(instants: list[datetime]) -> int:
    """Count whole seconds absent between the first and the last instant."""
    if not instants:
        return 0
    span = (max(instants) - min(instants)) // timedelta(seconds=1) + 1
    return span - len(set(instants))


class Command(BaseCommand):
    help = "Summarise the demo's runs: per job and per node, with duplicates and gaps."

    def add_arguments(self, parser):
        parser.add_argument(
            "--since", type=aware_datetime, help="Count runs created at or after this instant."
        )

    def handle(self, *args, **options):
        runs = JobRun.objects.filter(job__name__startswith="demo.")
        if options["since"]:
            runs = runs.filter(created_at__gte=options["since"])
        rows = list(runs.values_list("job__name", "node", "scheduled_at", "state"))
        ran = [row for row in rows if row[3] not in NOT_RUN]
        if not ran:
            raise CommandError("no demo runs found: did the scheduler nodes start?")
        self.per_job(ran)
        self.totals(runs, ran, Counter(row[3] for row in rows if row[3] in NOT_RUN))

    def per_job(self, rows):
        by_job: dict[str, Counter] = defaultdict(Counter)
        for name, node, _, _ in rows:
            by_job[name][node] += 1
        for name in sorted(by_job):
            nodes = "  ".join(f"{n}: {c}" for n, c in sorted(by_job[name].items()))
            self.stdout.write(f"  {name:<24} {sum(by_job[name].values()):>4} runs   {nodes}")

    def totals(self, runs, rows, not_run: Counter):
        duplicates = runs.values("job", "key").annotate(n=Count("id")).filter(n__gt=1).count()
        per_node = Counter(node for _, node, _, _ in rows)
        ticks = [at for name, _, at, _ in rows if name == "demo.tick"]
        failed = sum(1 for *_, state in rows if state == "failed")
        nodes = ", ".join(f"{n} {c}" for n, c in sorted(per_node.items()))
        line = (
            f"{len(rows)} runs; runs per node: {nodes}; (job, occurrence) claimed twice: "
            f"{duplicates}; demo.tick seconds missed: {missing_seconds(ticks)} of "
            f"{len(set(ticks)) + missing_seconds(ticks)}; failed: {failed}; not run: "
            f"{not_run[RunState.MISSED]} recorded missed, {not_run[RunState.SKIPPED]} skipped"
        )
        style = self.style.SUCCESS if duplicates == 0 and failed == 0 else self.style.ERROR
        self.stdout.write(style(f"Summary: {line}"))
        if duplicates:
            raise CommandError(f"{duplicates} occurrence(s) ran more than once")

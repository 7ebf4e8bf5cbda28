from datetime import timedelta

import pytest
from django.utils import translation

from django_cluster_jobs.models import JobDefinition, ScheduleKind
from django_cluster_jobs.wording import REPORT_LANGUAGE, describe_schedule

MINUTES = timedelta(minutes=90)


@pytest.mark.parametrize(
    ("fields", "text"),
    [({"schedule_kind": ScheduleKind.CRON, "cron": "0 9 * * *", "timezone": "Europe/Paris"},
      "At 09:00 (Europe/Paris)"),
     ({"schedule_kind": ScheduleKind.EVERY, "interval": MINUTES}, "every 1 h 30 min"),
     ({"schedule_kind": ScheduleKind.DELAY, "interval": MINUTES},
      "1 h 30 min after the previous run"),
     ({"schedule_kind": ScheduleKind.STARTUP}, "at scheduler start, on every node"),
     ({"schedule_kind": ScheduleKind.ON_DEMAND}, "on demand only")],
)  # fmt: skip
def test_one_describer_reads_every_kind(fields, text):
    job = JobDefinition(name="j", callable_name="j", **fields)
    assert describe_schedule(job) == text
    assert describe_schedule(job, REPORT_LANGUAGE) == text


def test_reports_are_worded_in_english_whatever_language_is_active():
    job = JobDefinition(
        name="j",
        callable_name="j",
        schedule_kind=ScheduleKind.CRON,
        cron="0 9 * * *",
        timezone="UTC",
    )
    with translation.override("fr"):
        assert describe_schedule(job, REPORT_LANGUAGE) == "At 09:00 (UTC)"

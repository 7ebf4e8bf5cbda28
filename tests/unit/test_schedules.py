"""Schedules: next occurrences, keys, DST rule, fixed-rate grids, snapping and declaration errors.

Every expected instant below is computed by hand (in UTC) from the wall time and the offset in
force: America/New_York is UTC-5 (EST) and UTC-4 (EDT), switching on 2026-03-08 at 02:00 EST and
on 2026-11-01 at 02:00 EDT; Europe/Paris is UTC+1 (CET) and UTC+2 (CEST).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings

from django_cluster_jobs import ImproperlyDeclared, job, registry
from django_cluster_jobs.schedules import (
    Cron,
    Delay,
    Every,
    OnDemand,
    Startup,
    from_fields,
    occurrence_key,
    to_fields,
)

NEW_YORK = "America/New_York"


def utc(text: str) -> datetime:
    """Parse '2026-05-28T09:00:00' (optionally with fractions) as a UTC instant."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def utcs(*texts: str) -> list[datetime]:
    return [utc(text) for text in texts]


def half_hours(start: str, end: str) -> list[datetime]:
    """Every UTC instant on the half hour in [start, end)."""
    at, stop, found = utc(start), utc(end), []
    while at < stop:
        found.append(at)
        at += timedelta(minutes=30)
    return found


def until(schedule: Cron, start: str, end: str) -> list[datetime]:
    """The occurrences in (start, end), following next_after from ``start``."""
    found, at, stop = [], utc(start), utc(end)
    while (at := schedule.next_after(at)) < stop:
        found.append(at)
    return found


# -- occurrence keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "key"),
    [
        (datetime(2026, 5, 28, 9, 0, tzinfo=UTC), "2026-05-28T09:00:00Z"),
        (datetime(2026, 5, 28, 9, 0, 7, tzinfo=UTC), "2026-05-28T09:00:07Z"),
        (datetime(2026, 5, 28, 9, 0, 0, 123000, tzinfo=UTC), "2026-05-28T09:00:00.123Z"),
        (datetime(2026, 5, 28, 9, 0, 0, 5000, tzinfo=UTC), "2026-05-28T09:00:00.005Z"),
        # Below a millisecond is not part of a key: the format never shows ".000".
        (datetime(2026, 5, 28, 9, 0, 0, 123456, tzinfo=UTC), "2026-05-28T09:00:00.123Z"),
        (datetime(2026, 5, 28, 9, 0, 0, 500, tzinfo=UTC), "2026-05-28T09:00:00Z"),
        # Any aware time is keyed by its UTC instant.
        (datetime(2026, 5, 28, 11, 0, tzinfo=ZoneInfo("Europe/Paris")), "2026-05-28T09:00:00Z"),
        (datetime(2026, 1, 2, 3, 4, 5, tzinfo=ZoneInfo(NEW_YORK)), "2026-01-02T08:04:05Z"),
    ],
)
def test_occurrence_key(at, key):
    assert occurrence_key(at) == key


def test_occurrence_key_refuses_a_naive_datetime():
    with pytest.raises(ValueError, match="aware"):
        occurrence_key(datetime(2026, 5, 28, 9, 0))


# -- cron in UTC ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # 5 fields: minute hour day-of-month month day-of-week. 2026-05-28 is a Thursday.
        ("0 9 * * *", "2026-05-28T08:59:30", ["2026-05-28T09:00", "2026-05-29T09:00"]),
        ("0 9 * * *", "2026-05-28T09:00:00", ["2026-05-29T09:00", "2026-05-30T09:00"]),
        ("* * * * *", "2026-05-28T09:00:00.500", ["2026-05-28T09:01", "2026-05-28T09:02"]),
        (
            "*/15 9-10 * * *",
            "2026-05-28T08:59:30",
            [
                *("2026-05-28T09:00", "2026-05-28T09:15", "2026-05-28T09:30", "2026-05-28T09:45"),
                *("2026-05-28T10:00", "2026-05-28T10:15", "2026-05-28T10:30", "2026-05-28T10:45"),
                "2026-05-29T09:00",
            ],
        ),
        (
            "10-20/5 * * * *",
            "2026-05-28T09:00",
            ["2026-05-28T09:10", "2026-05-28T09:15", "2026-05-28T09:20", "2026-05-28T10:10"],
        ),
        ("0,30 12 * * *", "2026-05-28T12:00", ["2026-05-28T12:30", "2026-05-29T12:00"]),
        (
            "5,10-12 0 1 * *",
            "2026-05-28T00:00",
            [
                *("2026-06-01T00:05", "2026-06-01T00:10", "2026-06-01T00:11", "2026-06-01T00:12"),
                "2026-07-01T00:05",
            ],
        ),
        # Weekday names and ranges: Friday 29 May, then Monday 1 June.
        ("0 9 * * mon-fri", "2026-05-29T08:00", ["2026-05-29T09:00", "2026-06-01T09:00"]),
        ("0 9 * * sat,sun", "2026-05-28T00:00", ["2026-05-30T09:00", "2026-05-31T09:00"]),
        # Sunday is 0 and 7.
        ("0 0 * * 0", "2026-05-28T00:00", ["2026-05-31T00:00", "2026-06-07T00:00"]),
        ("0 0 * * 7", "2026-05-28T00:00", ["2026-05-31T00:00", "2026-06-07T00:00"]),
        # Month names.
        ("0 0 1 jan,jul *", "2026-05-28T00:00", ["2026-07-01T00:00", "2027-01-01T00:00"]),
        ("0 6 15 mar-apr *", "2026-05-28T00:00", ["2027-03-15T06:00", "2027-04-15T06:00"]),
        # 29 February only in leap years.
        ("0 0 29 2 *", "2026-01-01T00:00", ["2028-02-29T00:00", "2032-02-29T00:00"]),
    ],
)
def test_cron_five_fields(expr, after, expected):
    assert Cron(expr).upcoming(utc(after), len(expected)) == utcs(*expected)


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # 6 fields: the SECOND comes first.
        ("*/10 * * * * *", "2026-05-28T09:00:00", ["09:00:10", "09:00:20", "09:00:30"]),
        ("*/10 * * * * *", "2026-05-28T09:00:05.250", ["09:00:10", "09:00:20", "09:00:30"]),
        ("* * * * * *", "2026-05-28T09:00:59", ["09:01:00", "09:01:01", "09:01:02"]),
        ("5 * * * * *", "2026-05-28T09:00:00", ["09:00:05", "09:01:05", "09:02:05"]),
        ("15,45 * * * * *", "2026-05-28T09:00:15", ["09:00:45", "09:01:15", "09:01:45"]),
        ("0-10/5 0 9 * * *", "2026-05-28T08:00:00", ["09:00:00", "09:00:05", "09:00:10"]),
        ("30 0 9 * * *", "2026-05-28T08:00:00", ["09:00:30"]),
    ],
)
def test_cron_six_fields_seconds_first(expr, after, expected):
    found = Cron(expr).upcoming(utc(after), len(expected))
    assert found == [utc(f"2026-05-28T{clock}") for clock in expected]


def test_cron_keys_follow_the_occurrences():
    found = Cron("*/10 * * * * *").upcoming(utc("2026-05-28T08:59:55"), 3)
    assert [occurrence_key(at) for at in found] == [
        "2026-05-28T09:00:00Z",
        "2026-05-28T09:00:10Z",
        "2026-05-28T09:00:20Z",
    ]


def test_cron_next_after_is_strictly_after_and_accepts_any_aware_time():
    schedule = Cron("0 9 * * *")
    paris_nine = datetime(2026, 5, 28, 11, 0, tzinfo=ZoneInfo("Europe/Paris"))  # 09:00 UTC
    assert schedule.next_after(paris_nine) == utc("2026-05-29T09:00")
    assert schedule.previous_at_or_before(paris_nine) == utc("2026-05-28T09:00")
    assert schedule.next_after(paris_nine).tzinfo is UTC


def test_cron_refuses_naive_datetimes():
    with pytest.raises(ValueError, match="aware"):
        Cron("0 9 * * *").next_after(datetime(2026, 5, 28, 9, 0))


# -- cron in a time zone --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "after", "expected"),
    [
        ("UTC", "2026-05-28T00:00", "2026-05-28T09:00"),
        ("Europe/Paris", "2026-05-28T00:00", "2026-05-28T07:00"),  # CEST, UTC+2
        ("Europe/Paris", "2026-01-15T00:00", "2026-01-15T08:00"),  # CET, UTC+1
        (NEW_YORK, "2026-05-28T00:00", "2026-05-28T13:00"),  # EDT, UTC-4
        (NEW_YORK, "2026-01-15T00:00", "2026-01-15T14:00"),  # EST, UTC-5
        ("Asia/Kolkata", "2026-05-28T00:00", "2026-05-28T03:30"),  # IST, UTC+5:30
    ],
)
def test_cron_nine_oclock_in_a_time_zone(tz, after, expected):
    assert Cron("0 9 * * *", tz).next_after(utc(after)) == utc(expected)


def test_paris_and_utc_differ_by_the_offset_in_force():
    paris, plain = Cron("0 9 * * *", "Europe/Paris"), Cron("0 9 * * *")
    winter, summer = utc("2026-01-15T00:00"), utc("2026-05-28T00:00")
    assert plain.next_after(winter) - paris.next_after(winter) == timedelta(hours=1)
    assert plain.next_after(summer) - paris.next_after(summer) == timedelta(hours=2)


def test_paris_spring_forward_and_fall_back():
    # 2026-03-29: 02:00 CET -> 03:00 CEST; 02:30 is skipped and fires at 03:30 CEST = 01:30 UTC.
    assert Cron("30 2 * * *", "Europe/Paris").upcoming(utc("2026-03-28T12:00"), 2) == utcs(
        "2026-03-29T01:30", "2026-03-30T00:30"
    )
    # 2026-10-25: 03:00 CEST -> 02:00 CET; 02:30 fires once, at 02:30 CEST = 00:30 UTC.
    assert Cron("30 2 * * *", "Europe/Paris").upcoming(utc("2026-10-24T12:00"), 2) == utcs(
        "2026-10-25T00:30", "2026-10-26T01:30"
    )


# -- America/New_York DST days of 2026 ----------------------------------------------------------


def test_spring_forward_skipped_time_fires_once_shifted_by_the_gap():
    # 02:30 does not exist on 2026-03-08: it fires at 03:30 EDT = 07:30 UTC.
    daily = Cron("30 2 * * *", NEW_YORK)
    assert daily.upcoming(utc("2026-03-07T00:00"), 3) == utcs(
        "2026-03-07T07:30",  # 02:30 EST
        "2026-03-08T07:30",  # 02:30 skipped -> 03:30 EDT
        "2026-03-09T06:30",  # 02:30 EDT
    )
    assert Cron("0 2 * * *", NEW_YORK).next_after(utc("2026-03-08T00:00")) == utc(
        "2026-03-08T07:00"  # 02:00 skipped -> 03:00 EDT
    )
    assert Cron("0 30 2 * * *", NEW_YORK).next_after(utc("2026-03-08T00:00")) == utc(
        "2026-03-08T07:30"  # the same rule with 6 fields
    )


@pytest.mark.parametrize("after", ["2026-03-08T06:59:59", "2026-03-08T07:00", "2026-03-08T07:29"])
def test_spring_forward_shifted_occurrence_is_found_from_just_after_the_jump(after):
    # A node that (re)plans at 03:00-03:29 EDT must still see the 02:30 occurrence at 03:30 EDT.
    assert Cron("30 2 * * *", NEW_YORK).next_after(utc(after)) == utc("2026-03-08T07:30")


def test_spring_forward_half_hourly():
    found = Cron("*/30 * * * *", NEW_YORK).upcoming(utc("2026-03-08T05:00"), 7)
    assert found == utcs(
        "2026-03-08T05:30",  # 00:30 EST
        "2026-03-08T06:00",  # 01:00 EST
        "2026-03-08T06:30",  # 01:30 EST
        "2026-03-08T07:00",  # 02:00 (skipped) and 03:00 EDT: one instant, one occurrence
        "2026-03-08T07:30",  # 02:30 (skipped) and 03:30 EDT: one instant, one occurrence
        "2026-03-08T08:00",  # 04:00 EDT
        "2026-03-08T08:30",  # 04:30 EDT
    )


def test_fall_back_repeated_time_fires_once_at_its_first_instance():
    # 01:30 happens twice on 2026-11-01: it fires at 01:30 EDT = 05:30 UTC only.
    daily = Cron("30 1 * * *", NEW_YORK)
    assert daily.upcoming(utc("2026-10-31T00:00"), 3) == utcs(
        "2026-10-31T05:30",  # 01:30 EDT
        "2026-11-01T05:30",  # 01:30 EDT, the first of the two
        "2026-11-02T06:30",  # 01:30 EST
    )
    # Not again at the second 01:30 (EST, 06:30 UTC).
    assert daily.next_after(utc("2026-11-01T05:30")) == utc("2026-11-02T06:30")
    assert daily.next_after(utc("2026-11-01T06:15")) == utc("2026-11-02T06:30")


def test_fall_back_half_hourly():
    found = Cron("*/30 * * * *", NEW_YORK).upcoming(utc("2026-11-01T04:00"), 6)
    assert found == utcs(
        "2026-11-01T04:30",  # 00:30 EDT
        "2026-11-01T05:00",  # 01:00 EDT
        "2026-11-01T05:30",  # 01:30 EDT; 01:00 and 01:30 EST (06:00, 06:30 UTC) do not fire
        "2026-11-01T07:00",  # 02:00 EST
        "2026-11-01T07:30",  # 02:30 EST
        "2026-11-01T08:00",  # 03:00 EST
    )


def test_half_hourly_across_both_dst_days_is_strictly_increasing_without_duplicates():
    schedule = Cron("*/30 * * * *", NEW_YORK)
    # Spring: local midnight 05:00 UTC to the next at 04:00 UTC, a 23-hour day.
    spring = until(schedule, "2026-03-08T04:59:59", "2026-03-09T04:00")
    # Fall: local midnight 04:00 UTC to the next at 05:00 UTC, a 25-hour day.
    fall = until(schedule, "2026-11-01T03:59:59", "2026-11-02T05:00")
    for day in (spring, fall):
        assert all(a < b for a, b in pairwise(day))
        assert len({occurrence_key(at) for at in day}) == len(day)
    # Every offset is a whole hour, so every UTC half hour fires ...
    assert spring == half_hours("2026-03-08T05:00", "2026-03-09T04:00")
    assert len(spring) == 46
    # ... except the second 01:00 and 01:30 of the fall-back night.
    repeated = set(utcs("2026-11-01T06:00", "2026-11-01T06:30"))
    assert fall == [
        at for at in half_hours("2026-11-01T04:00", "2026-11-02T05:00") if at not in repeated
    ]
    assert len(fall) == 48


@pytest.mark.parametrize("expr", ["*/30 * * * *", "30 2 * * *", "0 1 * * *", "15,45 1-3 * * *"])
@pytest.mark.parametrize("day", ["2026-03-08", "2026-11-01"])
def test_next_and_previous_agree_with_the_sequence_from_any_instant(expr, day):
    """A node planning from any instant sees the same occurrences as one running all along."""
    schedule = Cron(expr, NEW_YORK)
    sequence = schedule.upcoming(utc(f"{day}T00:00") - timedelta(days=2), 300)
    probe = utc(f"{day}T03:00")
    while probe < utc(f"{day}T10:00"):
        assert schedule.next_after(probe) == min(at for at in sequence if at > probe)
        assert schedule.previous_at_or_before(probe) == max(at for at in sequence if at <= probe)
        probe += timedelta(minutes=5, seconds=1)


def test_cron_previous_at_or_before_and_snap_inside_the_repeated_hour():
    hourly = Cron("0 * * * *", NEW_YORK)
    # 06:10 UTC is 01:10 EST, the second pass through 01:xx; 01:00 EST did not fire.
    assert hourly.previous_at_or_before(utc("2026-11-01T06:10")) == utc("2026-11-01T05:00")
    assert hourly.next_after(utc("2026-11-01T06:10")) == utc("2026-11-01T07:00")
    assert hourly.snap(utc("2026-11-01T06:10")) == utc("2026-11-01T07:00")  # 50 min vs 70
    assert hourly.snap(utc("2026-11-01T05:59")) == utc("2026-11-01T05:00")  # 59 min vs 61
    assert hourly.snap(utc("2026-11-01T06:00")) == utc("2026-11-01T05:00")  # a tie: the earlier
    half = Cron("*/30 * * * *", NEW_YORK)
    assert half.previous_at_or_before(utc("2026-11-01T05:30")) == utc("2026-11-01T05:30")
    assert half.previous_at_or_before(utc("2026-11-01T06:45")) == utc("2026-11-01T05:30")
    assert half.snap(utc("2026-11-01T06:45")) == utc("2026-11-01T07:00")
    per_second = Cron("* * * * * *", NEW_YORK)
    assert per_second.previous_at_or_before(utc("2026-11-01T06:30")) == utc("2026-11-01T05:59:59")
    assert per_second.next_after(utc("2026-11-01T06:30")) == utc("2026-11-01T07:00")


def test_cron_previous_at_or_before_and_snap_around_the_skipped_hour():
    daily = Cron("30 2 * * *", NEW_YORK)
    assert daily.previous_at_or_before(utc("2026-03-08T07:30")) == utc("2026-03-08T07:30")
    assert daily.previous_at_or_before(utc("2026-03-08T07:29:59")) == utc("2026-03-07T07:30")
    assert daily.snap(utc("2026-03-08T07:10")) == utc("2026-03-08T07:30")


def test_cron_snap_in_utc():
    schedule = Cron("*/10 * * * *")
    assert schedule.snap(utc("2026-05-28T09:04:59")) == utc("2026-05-28T09:00")
    assert schedule.snap(utc("2026-05-28T09:05")) == utc("2026-05-28T09:00")  # tie: earlier
    assert schedule.snap(utc("2026-05-28T09:05:01")) == utc("2026-05-28T09:10")
    assert schedule.snap(utc("2026-05-28T09:10")) == utc("2026-05-28T09:10")


def test_cron_value_object():
    schedule = Cron("0 9 * * *", "Europe/Paris")
    assert schedule == Cron("0 9 * * *", "Europe/Paris")
    assert schedule != Cron("0 9 * * *")
    assert (schedule.kind, schedule.slotted, schedule.longest_gap()) == ("cron", True, None)
    assert schedule.describe() == "cron '0 9 * * *' (Europe/Paris)"


# -- fixed rate -----------------------------------------------------------------------------------

# 2026-05-28T09:00:00Z is 1_779_958_800 s after the default epoch 1970-01-01; that is 4 more than
# a multiple of 7, so a 7-second grid has slots at 08:59:56, 09:00:03, 09:00:10, ...


def test_fixed_rate_grid_is_anchored_on_the_epoch():
    schedule = Every(timedelta(seconds=7))
    assert schedule.upcoming(utc("2026-05-28T09:00:00"), 3) == utcs(
        "2026-05-28T09:00:03", "2026-05-28T09:00:10", "2026-05-28T09:00:17"
    )
    assert schedule.previous_at_or_before(utc("2026-05-28T09:00:00")) == utc("2026-05-28T08:59:56")


@pytest.mark.parametrize(
    "started", ["2026-05-28T09:00:00", "2026-05-28T09:00:02.999", "2026-05-28T08:59:56.001"]
)
def test_fixed_rate_nodes_started_at_different_times_share_the_grid(started):
    schedule = Every(timedelta(seconds=7))
    keys = [occurrence_key(at) for at in schedule.upcoming(utc(started), 3)]
    assert keys == ["2026-05-28T09:00:03Z", "2026-05-28T09:00:10Z", "2026-05-28T09:00:17Z"]


def test_fixed_rate_grids_of_late_and_early_nodes_coincide():
    schedule = Every(timedelta(minutes=5))
    early = schedule.upcoming(utc("2026-05-28T09:02:13.123"), 10)
    late = schedule.upcoming(utc("2026-05-28T09:13:59.999"), 8)
    assert early[0] == utc("2026-05-28T09:05")
    assert early[2:] == late
    assert all(b - a == timedelta(minutes=5) for a, b in pairwise(early))


def test_fixed_rate_keys_with_milliseconds():
    # 1_779_958_800_000 ms is a multiple of 1500, so 09:00:00 is a slot.
    schedule = Every(timedelta(milliseconds=1500))
    keys = [occurrence_key(at) for at in schedule.upcoming(utc("2026-05-28T09:00:00"), 3)]
    assert keys == ["2026-05-28T09:00:01.500Z", "2026-05-28T09:00:03Z", "2026-05-28T09:00:04.500Z"]


def test_fixed_rate_grid_moves_with_the_epoch_setting():
    schedule = Every(timedelta(seconds=7))
    epoch = datetime(2026, 5, 28, 9, 0, 1, tzinfo=UTC)
    with override_settings(CLUSTER_JOBS={"EPOCH": epoch}):
        assert schedule.next_after(utc("2026-05-28T09:00:00")) == utc("2026-05-28T09:00:01")
        assert schedule.next_after(utc("2026-05-28T09:00:02")) == utc("2026-05-28T09:00:08")
        assert schedule.previous_at_or_before(utc("2026-05-28T09:00:00")) == utc(
            "2026-05-28T08:59:54"
        )
    # An aware EPOCH in any zone counts by its UTC instant: 01:00:02 in Paris is 00:00:02 UTC.
    # 2026-01-01T00:00:00Z is 1_767_225_600 s = 7 * 252_460_800 s after 1970, so this grid is the
    # default one moved 2 s later: 08:59:58, 09:00:05, ...
    paris_epoch = datetime(2026, 1, 1, 1, 0, 2, tzinfo=ZoneInfo("Europe/Paris"))
    with override_settings(CLUSTER_JOBS={"EPOCH": paris_epoch}):
        assert schedule.next_after(utc("2026-05-28T09:00:00")) == utc("2026-05-28T09:00:05")
    # Back on the default epoch once the override ends.
    assert schedule.next_after(utc("2026-05-28T09:00:00")) == utc("2026-05-28T09:00:03")


def test_fixed_rate_explicit_anchor():
    anchor = datetime(2026, 1, 1, 1, 0, 30, tzinfo=ZoneInfo("Europe/Paris"))  # 00:00:30 UTC
    schedule = Every(timedelta(minutes=1), anchor=anchor)
    assert schedule.anchor == utc("2026-01-01T00:00:30")
    assert schedule.next_after(utc("2026-05-28T09:00:00")) == utc("2026-05-28T09:00:30")
    with override_settings(CLUSTER_JOBS={"EPOCH": datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)}):
        assert schedule.next_after(utc("2026-05-28T09:00:00")) == utc("2026-05-28T09:00:30")


def test_fixed_rate_previous_at_or_before_and_snap():
    schedule = Every(timedelta(seconds=10))  # slots on whole tens of seconds
    assert schedule.previous_at_or_before(utc("2026-05-28T09:00:10")) == utc("2026-05-28T09:00:10")
    assert schedule.previous_at_or_before(utc("2026-05-28T09:00:19.999")) == utc(
        "2026-05-28T09:00:10"
    )
    assert schedule.next_after(utc("2026-05-28T09:00:10")) == utc("2026-05-28T09:00:20")
    assert schedule.snap(utc("2026-05-28T09:00:04")) == utc("2026-05-28T09:00:00")
    assert schedule.snap(utc("2026-05-28T09:00:05")) == utc("2026-05-28T09:00:00")  # tie: earlier
    assert schedule.snap(utc("2026-05-28T09:00:05.001")) == utc("2026-05-28T09:00:10")
    assert schedule.snap(utc("2026-05-28T09:00:10")) == utc("2026-05-28T09:00:10")


def test_fixed_rate_value_object():
    schedule = Every(timedelta(seconds=90))
    assert (schedule.kind, schedule.slotted) == ("every", True)
    assert schedule.longest_gap() == timedelta(seconds=90)
    assert schedule.describe() == "every 0:01:30"


# -- fixed delay, startup, on demand --------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "kind", "gap"),
    [
        (Delay(timedelta(seconds=2)), "delay", timedelta(seconds=2)),
        (Startup(), "startup", None),
        (OnDemand(), "on_demand", None),
    ],
)
def test_unslotted_schedules_have_no_fixed_occurrences(schedule, kind, gap):
    at = utc("2026-05-28T09:00")
    assert (schedule.kind, schedule.slotted, schedule.longest_gap()) == (kind, False, gap)
    assert schedule.next_after(at) is None
    assert schedule.previous_at_or_before(at) is None
    assert schedule.upcoming(at, 3) == []
    assert schedule.snap(at) == at


def test_unslotted_descriptions():
    assert Delay(timedelta(seconds=2)).describe() == "0:00:02 after the previous run"
    assert Startup().describe() == "at scheduler start, on every node"
    assert OnDemand().describe() == "on demand only"


@pytest.mark.parametrize(
    "schedule",
    [
        Cron("*/10 * * * * *", "Europe/Paris"),
        Every(timedelta(seconds=5)),
        Delay(timedelta(minutes=1)),
        Startup(),
        OnDemand(),
    ],
)
def test_definition_fields_round_trip(schedule):
    fields = to_fields(schedule)
    rebuilt = from_fields(
        fields["schedule_kind"], fields["cron"], fields["timezone"], fields["interval"]
    )
    assert rebuilt == schedule


# -- declaration errors ---------------------------------------------------------------------------


@pytest.fixture
def job_name(request: pytest.FixtureRequest):
    """A job name unique to the test; unregistered afterwards, whatever happened."""
    name = f"unit.schedules.{request.node.name}"
    yield name
    registry.unregister(name)


@pytest.mark.parametrize(
    ("options", "field", "hint"),
    [
        ({"cron": "* * * *"}, "cron", "5 fields"),
        ({"cron": "* * * * * * *"}, "cron", "this one has 7"),
        ({"cron": ""}, "cron", "this one has 0"),
        ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
        ({"cron": "* 24 * * *"}, "cron", "not a valid cron expression"),
        ({"cron": "* * 32 * *"}, "cron", "not a valid cron expression"),
        ({"cron": "0 0 * 13 *"}, "cron", "not a valid cron expression"),
        ({"cron": "0 0 * * 8"}, "cron", "not a valid cron expression"),
        ({"cron": "*/0 * * * *"}, "cron", "not a valid cron expression"),
        ({"cron": "60 * * * * *"}, "cron", "not a valid cron expression"),
        ({"cron": "0 0 * * funday"}, "cron", "not a valid cron expression"),
        ({"cron": "every day at nine o'clock"}, "cron", "not a valid cron expression"),
        ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
        ({"cron": "0 9 * * *", "tz": "Mars/Olympus_Mons"}, "tz", "IANA time zone"),
        ({"cron": "0 9 * * *", "tz": "../etc"}, "tz", "IANA time zone"),
        ({"every": timedelta(0)}, "every", "must be positive"),
        ({"every": timedelta(seconds=-5)}, "every", "must be positive"),
        ({"every": 5}, "every", "datetime.timedelta"),
        ({"every": timedelta(microseconds=1500)}, "every", "whole number of milliseconds"),
        ({"delay": timedelta(0)}, "delay", "must be positive"),
        ({"delay": timedelta(minutes=-1)}, "delay", "must be positive"),
        ({"delay": "10s"}, "delay", "datetime.timedelta"),
        ({"delay": timedelta(microseconds=1)}, "delay", "whole number of milliseconds"),
    ],
)
def test_invalid_schedule_is_refused_at_declaration(job_name, options, field, hint):
    with pytest.raises(ImproperlyDeclared) as caught:

        @job(name=job_name, **options)
        def handler() -> None:  # pragma: no cover - never declared
            pass

    error = caught.value
    assert (error.job, error.field) == (job_name, field)
    assert hint in error.hint
    assert str(error).startswith(f"Job {job_name!r}: invalid {field} ")
    assert hint in str(error)
    assert job_name not in registry


def test_schedule_objects_check_themselves():
    with pytest.raises(ImproperlyDeclared, match="invalid anchor"):
        Every(timedelta(seconds=1), anchor=datetime(2026, 1, 1))  # naive
    with pytest.raises(ImproperlyDeclared, match="invalid tz"):
        Cron("* * * * *", "Nowhere/Special")

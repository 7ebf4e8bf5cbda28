"""SQLite's wake file: every signal changes what a watcher sees, however close two fall."""

from __future__ import annotations

import pytest

from django_cluster_jobs.coordination import wakefile


def test_a_database_in_memory_has_no_wake_file():
    assert wakefile.path_for(":memory:") is None
    assert wakefile.path_for("file:jobs?mode=memory&cache=shared") is None
    assert wakefile.path_for("") is None


def test_the_wake_file_lies_beside_the_database(tmp_path):
    assert wakefile.path_for(tmp_path / "db.sqlite3") == tmp_path / "db.sqlite3-cluster-jobs-wake"


def test_every_signal_changes_the_stamp_across_replacements(tmp_path):
    path = tmp_path / "db.sqlite3-cluster-jobs-wake"
    seen = [wakefile.stamp(path)]
    assert seen == [None]
    for _ in range(wakefile.LIMIT + 10):  # past one replacement of the full file
        wakefile.signal(path)
        now = wakefile.stamp(path)
        assert now != seen[-1]
        seen.append(now)
    assert path.stat().st_size < wakefile.LIMIT
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no leftover of the replacement


def test_a_signal_that_cannot_be_written_raises_for_its_writer_to_log(tmp_path):
    path = tmp_path / "missing-directory" / "db.sqlite3-cluster-jobs-wake"
    with pytest.raises(OSError):
        wakefile.signal(path)

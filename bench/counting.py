"""Count the SQL statements a process sends through Django, by kind, on every thread.

A ``connection_created`` handler adds an execute wrapper to each new connection (connections are
per thread) and wraps its commit, so statements of the node loop, the heartbeat thread and the
executor threads are all seen. Not seen: the LISTEN connection (opened with the driver directly,
one LISTEN per connection) and the BEGIN that psycopg sends implicitly when a transaction starts.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created

RUN = "cluster_jobs_jobrun"
NODE = "cluster_jobs_workernode"
JOB = "cluster_jobs_jobdefinition"

#: (kind, pattern) tried in order on the statement with whitespace collapsed; first match wins.
KINDS = [
    ("transaction control", r"^(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b"),
    ("claim (slot INSERT … ON CONFLICT)", rf"INSERT INTO \"?{RUN}\"?.* ON CONFLICT"),
    ("pending take (UPDATE … RETURNING)", rf"^UPDATE \"?{RUN}\"? SET state = 'running'"),
    ("pending check (MIN due_at)", rf"MIN\(\"{RUN}\".\"due_at\"\)"),
    ("heartbeat: clock (SELECT now)", rf"^SELECT .*(NOW|CURRENT_TIMESTAMP).* FROM \"{NODE}\""),
    (
        "heartbeat: node + leases",
        rf"^WITH n AS \( UPDATE {NODE}"
        rf"|^UPDATE \"{NODE}\" SET \"last_heartbeat\""
        rf"|WHERE \(\"{RUN}\"\.\"node\" = %s AND .*\"{RUN}\"\.\"state\" = %s\)( ORDER BY [^()]*)?$"
        rf"|^SELECT \"{NODE}\".\"status\"",
    ),
    (
        "definitions check",
        rf"COUNT\(\"{JOB}\"\.\"id\"\)"
        rf"|^SELECT \"{JOB}\"\.\"id\" AS \"pk\", \"{JOB}\"\.\"updated_at\" AS \"updated_at\" "
        rf"FROM \"{JOB}\" ORDER BY",
    ),
    ("leader lease", r"cluster_jobs_lease"),
    (
        "leader chores",
        rf"\"lease_expires_at\" < |\"{NODE}\".*\"last_heartbeat\" < |\"finished_at\" < "
        rf"|MIN\(\"{NODE}\"\.\"started_at\"\)",
    ),
    ("notify", r"pg_notify"),
    ("run write-back and events", r"cluster_jobs_(jobrun|runevent)"),
    ("definitions", JOB),
    ("node row", NODE),
]
COMPILED = [(kind, re.compile(pattern, re.IGNORECASE | re.DOTALL)) for kind, pattern in KINDS]
COMMIT = "commit (transaction end)"


def kind_of(sql: str) -> str:
    """Name what a statement is for (see KINDS); "other" when nothing matches."""
    flat = " ".join(sql.split())
    for kind, pattern in COMPILED:
        if pattern.search(flat):
            return kind
    return "other"


class Log:
    """Thread-safe record of (wall-clock time, kind, sql) for every statement and commit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[tuple[float, str, str]] = []

    def add(self, kind: str, sql: str) -> None:
        with self._lock:
            self.entries.append((time.time(), kind, sql))

    def between(self, start: float, end: float) -> list[tuple[float, str, str]]:
        with self._lock:
            return [e for e in self.entries if start <= e[0] < end]

    def counts(self, start: float = 0.0, end: float = float("inf")) -> Counter[str]:
        return Counter(kind for _, kind, _ in self.between(start, end))


def install(log: Log | None = None) -> Log:
    """Start counting on every connection of this process (existing and future); return the log."""
    log = log or Log()

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        log.add(kind_of(sql), sql)
        return execute(sql, params, many, context)

    def attach(connection: Any, **_: Any) -> None:
        if wrapper in connection.execute_wrappers:
            return
        connection.execute_wrappers.append(wrapper)
        commit = connection._commit

        def counted_commit() -> Any:
            log.add(COMMIT, "COMMIT")
            return commit()

        connection._commit = counted_commit

    connection_created.connect(lambda sender, connection, **kw: attach(connection), weak=False)
    for connection in connections.all(initialized_only=True):
        attach(connection)
    return log


def dump_at_exit(log: Log, directory: str) -> None:
    """Write this process's counts to ``directory``/<pid>.json when it exits."""

    def dump() -> None:
        path = Path(directory) / f"{os.getpid()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(log.counts())))

    atexit.register(dump)


def load_dumps(directory: str) -> Counter[str]:
    """Add up the counts every process wrote to ``directory``."""
    total: Counter[str] = Counter()
    for path in sorted(Path(directory).glob("*.json")):
        total.update(json.loads(path.read_text()))
    return total

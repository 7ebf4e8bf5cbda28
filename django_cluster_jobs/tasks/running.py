"""The rows of the task runs this process is executing, read once when each starts.

``task_finished`` needs the run as stored at its end. For a success, that is the row read at
the start plus what the end wrote, which ``run_succeeded`` carries (``result`` and
``finished_at``): the node sends the signal only once the end is written under the run's fence,
so the row need not be read again. Any other end reads the row (its errors are in the timeline).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ..models import JobRun, RunState

#: Rows kept at most: a run whose end is never signalled (fenced out) must not stay forever.
KEPT = 1024

_rows: OrderedDict[int, JobRun] = OrderedDict()
_lock = threading.Lock()


def put(run: JobRun) -> None:
    """Keep ``run`` (just read as it starts) until its end is signalled."""
    with _lock:
        _rows[run.pk] = run
        while len(_rows) > KEPT:
            _rows.popitem(last=False)


def ended(run_id: int, signalled: dict[str, Any]) -> JobRun | None:
    """The run as its end stored it, from its start's row and a ``run_succeeded``'s arguments;
    None when that is not known here (another end, or a run this process did not start)."""
    with _lock:
        run = _rows.pop(run_id, None)
    if run is None or "finished_at" not in signalled:
        return None
    run.state, run.finished_at = RunState.SUCCEEDED, signalled["finished_at"]
    run.result, run.lease_expires_at = signalled.get("result"), None
    return run

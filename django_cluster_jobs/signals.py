"""Django signals for the run lifecycle; send with ``sender`` = the job name."""

from django.dispatch import Signal

#: Sent when a handler starts. Arguments: run_id, job, key, node, attempt.
run_started = Signal()
#: Sent when a run ends succeeded. Arguments: run_id, job, key, node, attempt, result.
run_succeeded = Signal()
#: Sent when a run ends failed. Arguments: run_id, job, key, node, attempt, error.
run_failed = Signal()

"""Who may act, and who acted: the permissions and the actor that the admin and the API share.

Reading a model needs Django's view (or change) permission on it; acting needs one of the two
permissions the app defines on jobs. Whoever acts is recorded in the ledger as ``<door>:<user>``
(``admin:alice``, ``api:deploy-bot``): in a run's reason, an event's node, a pause's reason and
the cluster events of the changes of jobs and of drains.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model

from .models import JobDefinition

_LABEL = JobDefinition._meta.app_label
#: Run a job now, enqueue a run, replay a run.
TRIGGER_PERMISSION = f"{_LABEL}.trigger_jobdefinition"
#: Pause, resume, enable and disable jobs, cancel runs, drain nodes.
MANAGE_PERMISSION = f"{_LABEL}.manage_jobdefinition"
#: The doors an operator acts through, as the actor names them.
ADMIN, API = "admin", "api"


def can_view(user: Any, model: type[Model]) -> bool:
    """Whether ``user`` may see ``model`` rows (view, or change as in the admin)."""
    opts = model._meta
    return user.has_perm(f"{opts.app_label}.view_{opts.model_name}") or user.has_perm(
        f"{opts.app_label}.change_{opts.model_name}"
    )


def actor(request: Any, door: str) -> str:
    """Return who acts through ``door`` in ``request``, as the ledger records it."""
    return f"{door}:{request.user.get_username()}"

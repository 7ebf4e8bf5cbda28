"""Who may do what: the admin's permission model, as one REST framework permission class.

- reading needs Django's view (or change) permission on every model a view shows;
- each action needs the permission named in :data:`ACTION_PERMISSIONS`;
- anything else that writes is refused, so a new endpoint is closed until it is mapped here.

The permissions themselves, and who acted, come from :mod:`django_cluster_jobs.permissions`,
which the admin shares.
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from ..permissions import MANAGE_PERMISSION, TRIGGER_PERMISSION, can_view

#: Viewset action name → the permission it needs.
ACTION_PERMISSIONS = {
    "trigger": TRIGGER_PERMISSION,
    "enqueue": TRIGGER_PERMISSION,
    "replay": TRIGGER_PERMISSION,
    "pause": MANAGE_PERMISSION,
    "resume": MANAGE_PERMISSION,
    "cancel": MANAGE_PERMISSION,
    "drain": MANAGE_PERMISSION,
}


class ClusterJobsPermission(BasePermission):
    """Map the request to the view permission of the shown models, or to its action's one.

    Views list the models they show in ``viewed_models``.
    """

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        perm = ACTION_PERMISSIONS.get(getattr(view, "action", None) or "")
        if perm is not None:
            return user.has_perm(perm)
        if request.method not in SAFE_METHODS:
            return False
        return all(can_view(user, model) for model in view.viewed_models)

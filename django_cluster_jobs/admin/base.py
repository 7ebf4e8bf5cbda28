"""What the console's admins share: the ledger database, read-only rows and operator actions.

Operator actions are ordinary admin actions guarded by ``permissions=["trigger"]`` or
``permissions=["manage"]`` (Django calls ``has_trigger_permission`` / ``has_manage_permission``),
so a user without the permission is neither offered the action nor able to post it. Each action
calls a function of :mod:`django_cluster_jobs.services`, writes one admin log entry per object it
changed and tells the user what happened. Some are also offered as buttons on an object's page.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote
from django.contrib.messages.storage.base import BaseStorage
from django.db import transaction
from django.db.models import Model
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.text import capfirst

from .. import permissions
from ..conf import app_settings
from ..stored import UNREADABLE, UnreadableRow, collecting, tolerant

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

    # The mixins below are listed before admin.ModelAdmin in each admin's bases: they extend
    # what the ModelAdmin does, so they are checked as if they were one.
    AdminBase = admin.ModelAdmin[Any]
else:
    AdminBase = object

logger = logging.getLogger(__name__)

#: POST field of the buttons on an object's page: come back to that page after the action.
FROM_OBJECT = "_from_object"

M = TypeVar("M", bound=Model)


class LedgerDatabaseMixin(AdminBase):
    """Read and write the ledger on CLUSTER_JOBS["DATABASE"] (Django's multi-database pattern).

    The list filters check their values as the list is built; a value that still reaches a
    query the database refuses is Django's "invalid lookup" (the list again, with ``?e=1``),
    logged, never a server error. (Django's change page already answers an id no row can have
    with "does not exist".)
    """

    class Media:
        css = {"all": ("cluster_jobs/admin.css",)}

    def get_changelist_instance(self, request):
        # A value from the query string that a column cannot hold, if a filter let it through:
        # a number beyond the column's range (OverflowError on SQLite, DataError elsewhere), a
        # NUL character (DataError from psycopg, ValueError from psycopg2). In a savepoint, so
        # that a request in a transaction (ATOMIC_REQUESTS) goes on after it.
        try:
            with transaction.atomic(using=app_settings.DATABASE):
                changelist = super().get_changelist_instance(request)
                # Read here, not while the page renders: a row that cannot be read is left
                # out of the page and named above it.
                with collecting() as unreadable:
                    len(changelist.result_list)  # reads the page's rows into its cache
        except UNREADABLE as exc:
            logger.warning("the %s list refused the query %r: %s", self.opts.model_name,
                           request.GET.urlencode()[:200], exc)  # fmt: skip
            raise IncorrectLookupParameters(exc) from exc
        self._name_unreadable(request, unreadable)
        return changelist

    def _name_unreadable(self, request, unreadable: list[UnreadableRow]) -> None:
        """Say why each row was left out, once (a page it came from may have said it)."""
        storage = messages.get_messages(request)
        said = {str(message) for message in storage}
        if isinstance(storage, BaseStorage):
            storage.used = False  # read, not shown: the page still shows them
        for row in unreadable:
            if str(row) not in said:
                self.message_user(request, str(row), messages.ERROR)

    def get_queryset(self, request):
        return tolerant(super().get_queryset(request).using(app_settings.DATABASE))

    def get_object(self, request, object_id, from_field=None):
        with collecting() as unreadable:
            found = super().get_object(request, object_id, from_field)
        self._name_unreadable(request, unreadable)
        request._cluster_jobs_unreadable = bool(unreadable)
        return found

    def delete_view(self, request, object_id, extra_context=None):
        # What is deleted with the row (a job's runs) is read to be listed and deleted: a row
        # of them that cannot be read stops that, said here rather than as a server error.
        try:
            return super().delete_view(request, object_id, extra_context)
        except UNREADABLE as exc:
            logger.warning("deleting %s %s: a row deleted with it cannot be read",
                           self.opts.model_name, object_id, exc_info=True)  # fmt: skip
            name = capfirst(str(self.opts.verbose_name))
            said = str(exc).split("\n", 1)[0][:200]
            self.message_user(request, f"{name} {object_id} cannot be deleted here: a row "
                              f"deleted with it cannot be read ({type(exc).__name__}: {said}). "
                              "Correct or delete that row with SQL first.",
                              messages.ERROR)  # fmt: skip
            opts = self.opts
            return HttpResponseRedirect(reverse(
                f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"))

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        # Django's "does not exist; perhaps it was deleted?" is wrong for a row that exists
        # and cannot be read: its message above says why, and the list is where to go.
        if getattr(request, "_cluster_jobs_unreadable", False):
            name = f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"
            return HttpResponseRedirect(reverse(name))
        return super()._get_obj_does_not_exist_redirect(  # type: ignore[misc]
            request, opts, object_id
        )

    def save_model(self, request, obj, form, change):
        obj.save(using=app_settings.DATABASE)

    def delete_model(self, request, obj):
        obj.delete(using=app_settings.DATABASE)


class ReadOnlyMixin(AdminBase):
    """The scheduler owns these rows: view them, never add, change or delete them here."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class OperatorActionsMixin(AdminBase):
    """Permission checks for operator actions, their report, and buttons on an object's page."""

    #: (action name, button label) of actions also offered on an object's change page.
    object_actions: tuple[tuple[str, StrOrPromise], ...] = ()
    change_form_template = "admin/cluster_jobs/change_form.html"

    def has_trigger_permission(self, request) -> bool:
        return request.user.has_perm(permissions.TRIGGER_PERMISSION)

    def has_manage_permission(self, request) -> bool:
        return request.user.has_perm(permissions.MANAGE_PERMISSION)

    def report(
        self, request, changed: Iterable[tuple[Model, str]], text: str, *, done: bool = True
    ) -> None:
        """Log each changed object with its message, then tell the user ``text``."""
        for obj, message in changed:
            self.log_change(request, obj, message)
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)

    def object_action_applies(self, name: str, obj: Any) -> bool:
        """Whether the button of action ``name`` makes sense for ``obj`` (all do by default)."""
        return True

    def object_action_choices(self, request, obj: Any) -> list[tuple[str, StrOrPromise]]:
        """Return (name, label) of the object-page actions this user may run on ``obj``."""
        if obj is None:
            return []
        allowed = self.get_actions(request)
        return [
            (name, label)
            for name, label in self.object_actions
            if name in allowed and self.object_action_applies(name, obj)
        ]

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        opts = self.model._meta
        context["object_actions"] = self.object_action_choices(request, obj)
        context["object_actions_url"] = reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"
        )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def response_action(self, request, queryset, *args: Any, **kwargs: Any):
        # Django 6.1 adds action_location; pass whatever the running version gives.
        response = super().response_action(request, queryset, *args, **kwargs)
        selected = request.POST.getlist("_selected_action")
        back = FROM_OBJECT in request.POST and len(selected) == 1
        if back and isinstance(response, HttpResponseRedirect):
            opts = self.model._meta
            name = f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change"
            return HttpResponseRedirect(reverse(name, args=[quote(selected[0])]))
        return response

"""Console pages beside the changelists: the cluster overview, an occurrence's story and a
workflow instance drawn as a graph."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from ..bounds import EARLIEST_RUN_AT, LATEST_RUN_AT
from ..columns import holds_a_name
from ..conf import app_settings, ledger
from ..models import JobDefinition, RunState
from ..overview import HOURS, cluster_overview, occurrence_story
from ..stored import tolerant
from ..workflows import BOX_HEIGHT, BOX_WIDTH, instance_of


def _context(model_admin: ModelAdmin, request: HttpRequest, title: str) -> dict:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    return {**model_admin.admin_site.each_context(request), "title": title,
            "opts": model_admin.model._meta}  # fmt: skip


def overview_view(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Nodes and leader, each job's last 24 hours, failing and breaker-open jobs first, the
    dead letters and the queues."""
    context = _context(model_admin, request, _("Cluster overview"))
    report = cluster_overview(app_settings.DATABASE)
    for row in report["unreadable"]:  # left out of the page: named above it
        messages.error(request, row["message"])
    runs = reverse(f"{model_admin.admin_site.name}:cluster_jobs_jobrun_changelist")
    story = reverse(f"{model_admin.admin_site.name}:cluster_jobs_occurrence")
    ids = dict(ledger(JobDefinition).values_list("name", "pk"))
    now = datetime.fromisoformat(report["generated_at"])
    for job in report["jobs"]:
        for cell in job["strip"]:
            # The current hour's cell tells the latest occurrence so far, not one still to come.
            last = min(cell.start + timedelta(hours=1) - timedelta(milliseconds=1), now)
            cell.url = f"{story}?{urlencode({'job': job['name'], 'at': _iso(last)})}"
        job["runs_url"] = f"{runs}?{urlencode({'q': job['name']})}"
        dead = {"job": ids.get(job["name"], ""), "state__exact": RunState.DEAD}
        job["dead_letters_url"] = f"{runs}?{urlencode(dead)}"
    for queue in report["queues"]:
        waiting = {"queue": queue["queue"], "state__exact": RunState.PENDING}
        queue["runs_url"] = f"{runs}?{urlencode(waiting)}"
    context.update(report=report, hours=HOURS, story_url=story)
    return TemplateResponse(request, "admin/cluster_jobs/overview.html", context)


def occurrence_view(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Pick a job and an instant; tell that occurrence's story."""
    context = _context(model_admin, request, _("Why didn't it run?"))
    jobs = list(ledger(JobDefinition).order_by("name").values_list("name", flat=True))
    name, text = request.GET.get("job", ""), request.GET.get("at", "")
    context.update(jobs=jobs, job_name=name, at_text=text, story=None, error="")
    if name:
        job = _job_named(name)
        asked = _instant(text)
        if job is None:
            context["error"] = _("No job is named %(name)s.") % {"name": name}
        elif asked is None:
            context["error"] = _(
                "Give the instant as an ISO date and time from %(earliest)s to %(latest)s, "
                "e.g. 2026-05-28T09:00:00Z."
            ) % {"earliest": EARLIEST_RUN_AT.date(), "latest": LATEST_RUN_AT.date()}
        else:
            context["story"] = occurrence_story(app_settings.DATABASE, job, asked)
    return TemplateResponse(request, "admin/cluster_jobs/occurrence.html", context)


def instance_view(model_admin: ModelAdmin, request: HttpRequest, pk: int) -> HttpResponse:
    """A workflow instance as a graph: each job a box in the state of its run there."""
    instance = instance_of(app_settings.DATABASE, pk)
    if instance is None:
        raise Http404(_("Run %(pk)s starts no workflow instance.") % {"pk": pk})
    title = _("Workflow instance %(id)s") % {"id": instance.id}
    context = _context(model_admin, request, title)
    change = f"{model_admin.admin_site.name}:cluster_jobs_jobrun_change"
    for step in instance.steps:
        step.url = reverse(change, args=[step.run.pk]) if step.run else ""
    context.update(instance=instance, box_width=BOX_WIDTH, box_height=BOX_HEIGHT)
    return TemplateResponse(request, "admin/cluster_jobs/instance.html", context)


def _job_named(name: str) -> JobDefinition | None:
    """The job of that name; None for a name no job can have (longer than the column, or with
    a NUL character, which PostgreSQL's text cannot hold)."""
    if not holds_a_name(name):
        return None
    return tolerant(ledger(JobDefinition).filter(name=name)).first()


def _instant(text: str) -> datetime | None:
    """An ISO instant between EARLIEST_RUN_AT and LATEST_RUN_AT; a naive one is read as UTC.
    None when it is not one (at the calendar's edges a story's hours would not be dates)."""
    try:
        at = parse_datetime(text.strip().replace(" ", "T"))
        if at is None:
            return None
        at = at if timezone.is_aware(at) else at.replace(tzinfo=UTC)
        return at if EARLIEST_RUN_AT <= at <= LATEST_RUN_AT else None
    except (ValueError, OverflowError):  # out of range once read as UTC
        return None


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")

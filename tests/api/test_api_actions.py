"""The API's actions: answers that show only what the caller may view, the actor in the ledger,
and the status codes of every refusal (405, 404, 400, never 500)."""

from __future__ import annotations

import base64
import logging
from urllib.parse import urlencode

import pytest

from django_cluster_jobs.models import JobDefinition, JobRun, Outcome, RunEvent
from tests.api_fixtures import MANAGE, TRIGGER, VIEW_ALL, url

pytestmark = pytest.mark.django_db

#: The fields of an action's answer to a caller who may not view what it acted on.
RECEIPTS = {
    "run": {"id", "state", "url"},
    "job": {"name", "paused", "paused_until", "url"},
    "node": {"node_id", "status", "url"},
}

#: (url name, what it acts on in ``cluster``, its permission, success status, answer kind)
ACTIONS = [
    ("job-trigger", "report", TRIGGER, 201, "run"),
    ("job-enqueue", "report", TRIGGER, 201, "run"),
    ("run-replay", "failed", TRIGGER, 201, "run"),
    ("run-cancel", "running", MANAGE, 202, "run"),
    ("job-pause", "report", MANAGE, 200, "job"),
    ("job-resume", "report", MANAGE, 200, "job"),
    ("node-drain", "node-a", MANAGE, 202, "node"),
]


def target(cluster, name: str) -> object:
    return cluster[name].pk if name in cluster else name


def post(client, path: str, body: object = None):
    return client.post(path, {} if body is None else body, format="json")


# -- answers: what the caller may view ---------------------------------------------------------


@pytest.mark.parametrize(("name", "on", "perm", "success", "kind"), ACTIONS)
def test_an_action_answers_a_receipt_to_a_caller_who_may_not_view(
    cluster, user_with, name, on, perm, success, kind
):
    path = url(name, target(cluster, on))
    response = post(user_with(perm), path)
    assert response.status_code == success, response.content
    body = response.json()
    assert set(body) == RECEIPTS[kind]
    assert body["url"].startswith("http://testserver/api/")


@pytest.mark.parametrize(("name", "on", "perm", "success", "kind"), ACTIONS)
def test_an_action_answers_the_full_detail_to_a_caller_who_may_view(
    cluster, user_with, name, on, perm, success, kind
):
    response = post(user_with(perm, *VIEW_ALL), url(name, target(cluster, on)))
    assert response.status_code == success, response.content
    body = response.json()
    assert set(body) > RECEIPTS[kind]
    detail_only = {"run": "events", "job": "next_fire_times", "node": "heartbeat_age_seconds"}
    assert detail_only[kind] in body


def test_a_receipt_links_to_the_run_it_made(cluster, user_with):
    receipt = post(user_with(TRIGGER), url("job-trigger", "report"), {"payload": {"value": 1}})
    run = JobRun.objects.get(pk=receipt.json()["id"])
    assert receipt.json() == {
        "id": run.pk, "state": "pending", "url": f"http://testserver{url('run-detail', run.pk)}"
    }  # fmt: skip


# -- the actor ---------------------------------------------------------------------------------


def test_enqueue_records_who_enqueued(cluster, operator):
    response = post(operator, url("job-enqueue", "report"))
    assert JobRun.objects.get(pk=response.json()["id"]).reason == "enqueued by api:operator0"


def test_trigger_records_who_triggered_in_the_insert(cluster, operator):
    response = post(operator, url("job-trigger", "report"))
    run = JobRun.objects.get(pk=response.json()["id"])
    assert (run.outcome, run.reason) == (Outcome.MANUAL, "triggered by api:operator0")


def test_a_pause_with_a_reason_still_records_who_paused(cluster, operator):
    post(operator, url("job-pause", "report"), {"reason": "deploy"})
    reason = JobDefinition.objects.get(name="report").pause_reason
    assert reason == "deploy (paused by api:operator0)"


def test_a_long_pause_reason_keeps_the_actor_within_the_column(cluster, operator):
    post(operator, url("job-pause", "report"), {"reason": "x" * 200})
    reason = JobDefinition.objects.get(name="report").pause_reason
    assert len(reason) <= 200 and reason.endswith("… (paused by api:operator0)")


@pytest.mark.parametrize(
    ("name", "on", "kind", "node", "says"),
    [("job-resume", "report", "job_changed", "", "report: resumed by api:operator0"),
     ("node-drain", "node-a", "drain_requested", "node-a", "drain requested by api:operator0")],
)  # fmt: skip
def test_resume_and_drain_record_who_asked(cluster, operator, caplog, name, on, kind, node, says):
    from django_cluster_jobs.models import ClusterEvent

    caplog.set_level(logging.INFO, logger="django_cluster_jobs")
    post(operator, url(name, on))
    [event] = ClusterEvent.objects.filter(kind=kind)
    assert (event.node, event.detail) == (node, says)
    [record] = [r for r in caplog.records if says in r.getMessage()]
    assert record.actor == "api:operator0"


def test_replay_and_cancel_record_who_asked(cluster, operator):
    post(operator, url("run-replay", cluster["failed"].pk))
    post(operator, url("run-cancel", cluster["running"].pk))
    nodes = set(RunEvent.objects.filter(node__startswith="api:").values_list("kind", "node"))
    assert nodes == {("replayed", "api:operator0"), ("cancel_req", "api:operator0")}


# -- unsupported methods -----------------------------------------------------------------------

READ_URLS = [
    ("job-list", ()), ("job-detail", ("report",)), ("run-list", ()), ("run-detail", ("ok",)),
    ("node-list", ()), ("node-detail", ("node-a",)), ("leader", ()), ("status", ()),
]  # fmt: skip


@pytest.mark.parametrize(("name", "args"), READ_URLS)
@pytest.mark.parametrize("method", ["put", "patch", "delete", "post"])
def test_writing_to_a_read_only_url_is_405(cluster, operator, name, args, method):
    path = url(name, *(target(cluster, arg) for arg in args))
    response = getattr(operator, method)(path, {}, format="json")
    assert response.status_code == 405, response.content
    assert "GET" in response["Allow"]


@pytest.mark.parametrize(("name", "on", "perm", "success", "kind"), ACTIONS)
@pytest.mark.parametrize("method", ["get", "put", "patch", "delete"])
def test_an_action_url_answers_405_to_anything_but_post(
    cluster, user_with, name, on, perm, success, kind, method
):
    response = getattr(user_with(), method)(url(name, target(cluster, on)))
    assert response.status_code == 405, response.content
    assert response["Allow"] == "POST, OPTIONS"


# -- unknown jobs ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["job-detail", "job-trigger", "job-enqueue", "job-pause",
                                  "job-resume"])  # fmt: skip
def test_an_unknown_job_is_404_everywhere(operator, name):
    method = operator.get if name == "job-detail" else operator.post
    response = method(url(name, "nope"), {}, format="json")
    assert response.status_code == 404, response.content
    assert "No job named 'nope'" in response.json()["detail"]
    assert not JobRun.objects.exists()


# -- idempotent enqueue ------------------------------------------------------------------------


def test_a_repeated_idempotency_key_answers_200_with_the_first_run(cluster, operator):
    body = {"payload": {"value": 2}, "idempotency_key": "order-42"}
    first = post(operator, url("job-enqueue", "report"), body)
    again = post(operator, url("job-enqueue", "report"), body)
    other = post(operator, url("job-enqueue", "report"), {**body, "idempotency_key": "order-43"})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert again.json() == first.json()
    assert other.json()["id"] != first.json()["id"]


# -- crafted input -----------------------------------------------------------------------------


def cursor(query: dict[str, str]) -> str:
    return base64.b64encode(urlencode(query).encode()).decode()


@pytest.mark.parametrize(
    "value",
    ["garbage", "a", cursor({"p": "abc"}), cursor({"p": "1e9"}), cursor({"p": "-5"}),
     cursor({"p": str(2**70)}), cursor({"o": "abc"}), cursor({"o": "-1"}), cursor({"r": "x"}),
     base64.b64encode(b"\xff\xfe").decode(), cursor({"p": "1\x00"})],
)  # fmt: skip
def test_a_crafted_cursor_is_400(cluster, viewer, value):
    response = viewer.get(url("run-list"), {"cursor": value})
    assert response.status_code == 400, response.content
    assert "cursor" in response.json()["detail"].lower()


def test_a_valid_cursor_still_pages(cluster, viewer):
    response = viewer.get(url("run-list"), {"cursor": cursor({"p": "10"})})
    assert response.status_code == 200


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("name", ["job-trigger", "job-enqueue", "job-pause"])
@pytest.mark.parametrize(
    "body",
    [nested(10_000), f'{{"payload": {{"value": {nested(10_000)}}}}}',
     f'{{"payload": {{"value": {nested(500)}}}}}', f'{{"reason": {nested(10_000)}}}'],
)  # fmt: skip
def test_deeply_nested_json_is_400(cluster, operator, name, body):
    response = operator.post(url(name, "report"), body, content_type="application/json")
    assert response.status_code == 400, response.content[:200]
    assert "nested" in response.json()["detail"]
    assert not JobRun.objects.filter(outcome__in=(Outcome.MANUAL, Outcome.ENQUEUED)).exists()


def test_a_payload_nested_within_the_bound_is_taken(cluster, operator):
    payload = {"value": [[[[{"deep": [1]}]]]]}
    response = post(operator, url("job-trigger", "report"), {"payload": payload})
    assert response.status_code == 201
    assert JobRun.objects.get(pk=response.json()["id"]).payload == payload

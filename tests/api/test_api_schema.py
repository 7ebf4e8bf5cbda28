"""The API's OpenAPI schema holds: every answer of every endpoint and action, refusals included,
is what the schema says, and every answer the schema lists is one the API gives.

Requests and responses are checked with openapi-core against the schema the API serves; objects
may carry no property the schema does not list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.urls import resolve
from openapi_core import Config, OpenAPI
from openapi_core.testing import MockRequest, MockResponse
from rest_framework.authentication import BasicAuthentication, SessionAuthentication
from rest_framework.test import APIClient

from django_cluster_jobs import services
from django_cluster_jobs.api import schema
from django_cluster_jobs.api.views import ClusterView
from django_cluster_jobs.models import Lease, NodeStatus, RunState, WorkerNode
from tests.api_fixtures import MANAGE, TRIGGER, VIEW_ALL, url
from tests.factories import JobRunFactory

pytestmark = pytest.mark.django_db

HOST = "http://testserver"


def session_client(*codenames: str) -> APIClient:
    """A client signed in through a session (so its requests carry the schema's cookie)."""
    user = User.objects.create_user(f"caller{User.objects.count()}")
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def spec() -> dict:
    """The schema the API serves."""
    response = session_client().get(url("schema"), {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


@pytest.fixture
def openapi(spec) -> OpenAPI:
    """The schema, ready to check calls against (loading it validates it)."""
    return OpenAPI.from_dict(spec, config=Config(additional_properties_default_policy="forbid"))


@dataclass
class Caller:
    """Calls the API as one client and checks each call against the schema."""

    openapi: OpenAPI
    client: APIClient
    seen: set[tuple[str, str, int]] = field(default_factory=set)

    def __call__(self, method: str, path: str, status: int, *, body: object = None,
                 query: dict | None = None, raw: bytes | None = None,
                 media: str = "application/json", conforms: bool = True) -> dict:  # fmt: skip
        """Make the call, expect ``status``, check the answer (and the request if it conforms)."""
        data = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
        full = f"{path}?{urlencode(query, doseq=True)}" if query else path
        response = self.client.generic(method, full, data, content_type=media)
        assert response.status_code == status, (method, full, response.content[:300])
        request = self._request(method, path, query, data, media)
        answer = MockResponse(response.content, response.status_code, dict(response.headers),
                              response["Content-Type"])  # fmt: skip
        self.openapi.validate_response(request, answer)
        if conforms:
            self.openapi.validate_request(request)
        self.seen.add((resolve(path).url_name, method.lower(), status))
        return response.json()

    def _request(self, method, path, query, data, media) -> MockRequest:
        cookies = {name: morsel.value for name, morsel in self.client.cookies.items()}
        items = [(k, v) for k, values in (query or {}).items() for v in _listed(values)]
        return MockRequest(HOST, method, path, args=items, cookies=cookies, data=data,
                           content_type=media)  # fmt: skip


def _listed(value: object) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


@pytest.fixture
def callers(openapi, cluster):
    """Callers by what they may do, sharing one record of the answers seen."""
    seen: set = set()

    def as_(*codenames: str) -> Caller:
        return Caller(openapi, session_client(*codenames), seen)

    return {"all": as_(*VIEW_ALL, TRIGGER, MANAGE), "trigger": as_(TRIGGER),
            "manage": as_(MANAGE), "none": as_(), "anonymous": Caller(openapi, APIClient(), seen),
            "seen": seen}  # fmt: skip


# -- scenarios: each calls one endpoint the ways it can answer ----------------------------------


def jobs(c, cluster) -> None:
    listed = c["all"]("get", url("job-list"), 200)
    assert [job["name"] for job in listed] == ["report"]
    assert c["all"]("get", url("job-detail", "report"), 200)["name"] == "report"
    c["all"]("get", url("job-detail", "nope"), 404)


def trigger(c, cluster) -> None:
    path = url("job-trigger", "report")
    assert c["all"]("post", path, 201, body={"payload": {"value": 1}})["events"] == []
    assert set(c["trigger"]("post", path, 201, body={})) == {"id", "state", "url"}
    c["all"]("post", path, 400, body={"payload": {"nope": 1}})
    c["all"]("post", path, 400, raw=b"{not json", conforms=False)
    c["all"]("post", path, 415, raw=b"value=1", media="text/plain", conforms=False)
    c["all"]("post", url("job-trigger", "nope"), 404, body={})


def enqueue(c, cluster) -> None:
    path, body = url("job-enqueue", "report"), {"idempotency_key": "k", "priority": 1}
    first = c["all"]("post", path, 201, body={**body, "run_at": "2030-01-02T03:04:05Z"})
    assert c["trigger"]("post", path, 200, body=body)["id"] == first["id"]
    c["all"]("post", path, 400, body={"priority": "high"}, conforms=False)
    c["all"]("post", path, 415, raw=b"x", media="text/plain", conforms=False)
    c["all"]("post", url("job-enqueue", "nope"), 404, body={})


def pause_and_resume(c, cluster) -> None:
    pause = url("job-pause", "report")
    assert c["all"]("post", pause, 200, body={"reason": "deploy"})["paused"] is True
    assert set(c["manage"]("post", pause, 200, body={})) == {"name", "paused", "paused_until",
                                                             "url"}  # fmt: skip
    c["all"]("post", pause, 400, body={"until": "2000-01-01T00:00:00Z"})
    c["all"]("post", pause, 415, raw=b"x", media="text/plain", conforms=False)
    c["all"]("post", url("job-pause", "nope"), 404, body={})
    assert c["all"]("post", url("job-resume", "report"), 200)["paused"] is False
    c["manage"]("post", url("job-resume", "report"), 200)
    c["all"]("post", url("job-resume", "nope"), 404)


def runs(c, cluster) -> None:
    query = {"page_size": 1, "state": ["failed", "running"]}
    following = urlsplit(c["all"]("get", url("run-list"), 200, query=query)["next"])
    c["all"]("get", following.path, 200, query=parse_qs(following.query))
    c["all"]("get", url("run-list"), 400, query={"state": "exploded"}, conforms=False)
    c["all"]("get", url("run-list"), 400, query={"cursor": "garbage"})
    detail = c["all"]("get", url("run-detail", cluster["failed"].pk), 200)
    assert detail["events"] and detail["logs"]
    c["all"]("get", url("run-detail", 999_999), 404)


def run_actions(c, cluster) -> None:
    running, failed = cluster["running"], cluster["failed"]
    assert c["all"]("post", url("run-cancel", running.pk), 202)["cancel_requested"] is True
    c["manage"]("post", url("run-cancel", running.pk), 202)
    c["all"]("post", url("run-cancel", failed.pk), 409)
    c["all"]("post", url("run-cancel", 999_999), 404)
    assert c["all"]("post", url("run-replay", failed.pk), 201)["origin"] == failed.pk
    c["trigger"]("post", url("run-replay", failed.pk), 201)
    c["all"]("post", url("run-replay", running.pk), 409)
    c["all"]("post", url("run-replay", 999_999), 404)


def nodes(c, cluster) -> None:
    assert len(c["all"]("get", url("node-list"), 200)) == 2
    c["all"]("get", url("node-detail", "node-a"), 200)
    c["all"]("get", url("node-detail", "nope"), 404)
    assert c["all"]("post", url("node-drain", "node-a"), 202)["status"] == NodeStatus.DRAINING
    c["all"]("post", url("node-drain", "node-b"), 409)
    WorkerNode.objects.filter(node_id="node-b").update(status=NodeStatus.ACTIVE)
    c["manage"]("post", url("node-drain", "node-b"), 202)
    c["all"]("post", url("node-drain", "nope"), 404)


def leader_and_status(c, cluster) -> None:
    assert c["all"]("get", url("leader"), 200)["holder"] == "node-a"
    JobRunFactory(job=cluster["job"], state=RunState.DEAD, error="boom")
    report = c["all"]("get", url("status"), 200, query={"failures": 5})
    assert report["leader"]["holder"] == "node-a" and report["recent_failures"]
    c["all"]("get", url("status"), 400, query={"failures": -1}, conforms=False)
    Lease.objects.filter(name="leader").delete()
    assert c["all"]("get", url("leader"), 200) == {"holder": None, "since": None, "fence": None,
                                                   "expires_at": None}  # fmt: skip
    assert c["all"]("get", url("status"), 200)["leader"] is None


def instances(c, cluster) -> None:
    for name in ("tests.flow_c", "tests.flow_d"):
        services.definition_for(name)
    root = JobRunFactory(job=services.definition_for("tests.flow_root"), key="root")
    JobRunFactory(job=services.definition_for("tests.flow_b"), key=f"after:{root.pk}",
                  instance=root.pk, state=RunState.RUNNING)  # fmt: skip
    listed = c["all"]("get", url("instance-list"), 200, query={"job": "tests.flow_root"})
    assert [item["id"] for item in listed["results"]] == [root.pk]
    assert c["all"]("get", url("instance-list"), 200, query={"job": "report"})["results"] == []
    c["all"]("get", url("instance-list"), 400, query={"cursor": "garbage"})
    detail = c["all"]("get", url("instance-detail", root.pk), 200)
    assert detail["state"] == RunState.RUNNING and len(detail["steps"]) == 4
    c["all"]("get", url("instance-detail", cluster["ok"].pk), 404)  # in no workflow


SCENARIOS = [jobs, trigger, enqueue, pause_and_resume, runs, run_actions, nodes,
             leader_and_status, instances]  # fmt: skip


def operations(spec: dict) -> list[tuple[str, str, str, list[int]]]:
    """Return (url name, method, a path to call, its documented statuses) of every operation."""
    found = []
    for template, item in spec["paths"].items():
        path = template.replace("{name}", "report").replace("{node_id}", "node-a")
        path = path.replace("{id}", "1")
        for method, operation in item.items():
            codes = sorted(int(code) for code in operation["responses"])
            found.append((resolve(path).url_name, method, path, codes))
    return found


def refusals(c, spec: dict) -> None:
    """Call every operation unauthenticated, then signed in without its permission."""
    for _name, method, path, _codes in operations(spec):
        c["anonymous"](method, path, 401, body={} if method == "post" else None, conforms=False)
        c["none"](method, path, 403, body={} if method == "post" else None)


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_every_answer_is_what_the_schema_says(callers, cluster, scenario):
    scenario(callers, cluster)


@pytest.fixture
def asking_for_credentials(monkeypatch) -> None:
    """Authenticate by Basic first, which asks for credentials: anonymous callers get 401."""
    schemes = (BasicAuthentication, SessionAuthentication)
    monkeypatch.setattr(ClusterView, "authentication_classes", schemes, raising=False)


def test_refusals_are_what_the_schema_says(callers, spec, asking_for_credentials):
    refusals(callers, spec)


def test_every_answer_the_schema_lists_is_given(callers, cluster, spec, asking_for_credentials):
    for scenario in SCENARIOS:
        scenario(callers, cluster)
    refusals(callers, spec)
    listed = {(name, method, code) for name, method, _path, codes in operations(spec)
              for code in codes}  # fmt: skip
    assert listed - callers["seen"] == set()
    assert len(listed) > 60


def test_the_schema_lists_every_url_of_the_api(spec):
    names = {name for name, *_ in operations(spec)}
    assert names == {
        "job-list", "job-detail", "job-trigger", "job-enqueue", "job-pause", "job-resume",
        "run-list", "run-detail", "run-cancel", "run-replay", "instance-list",
        "instance-detail", "node-list", "node-detail", "node-drain", "leader", "status",
    }  # fmt: skip


@pytest.mark.parametrize(
    "custom", [[], ["--custom-settings", f"{schema.__name__}.SCHEMA_SETTINGS"]]
)
def test_the_schema_validates_without_warnings(tmp_path, custom):
    """As the project's settings generate it (OpenAPI 3.0), and as the API serves it (3.1)."""
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out), *custom)
    assert "/api/jobs/{name}/trigger/" in out.read_text()


def test_the_schema_needs_a_signed_in_user():
    assert APIClient().get(url("schema")).status_code in (401, 403)

"""No admin page and no API endpoint answers 500, whatever the query string or the path: each
page is asked with generated values for the parameters it reads (filters, search, ordering,
page, facets, cursors, the occurrence story's job and instant) and for some it does not, and
each detail URL with a generated key. A malformed value gets the list again flagged ``?e=1``,
the page with an error message, a 400 or a 404."""

from __future__ import annotations

from urllib.parse import quote, urlencode

import pytest
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_cluster_jobs.models import RunState
from tests.api_fixtures import url
from tests.factories import JobDefinitionFactory, JobRunFactory, WorkerNodeFactory

pytestmark = pytest.mark.django_db

EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    # The fixtures' rows are only read: every example may share them.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Values at the edges of every type a parameter is read as: numbers beyond 64 bits, dates at
#: the calendar's ends in far time zones, control characters, text longer than any column.
EDGES = [
    "", "0", "-1", str(2**63), str(2**64), "9" * 40, "1e400", "nan", "inf", "0x1f", "١٢",
    "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "0000-00-00", "2026-13-45",
    "a\x00b", "\x00", "\x1b[31m", "x" * 5000, "' OR 1=1 --", "%", "_", "report", "tests.manual",
    "succeeded", "running,pending", "-id", "?", "&", "=", "é", "\u202e",
]  # fmt: skip
#: Text without lone surrogates (which no URL can carry).
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
VALUES = st.sampled_from(EDGES) | TEXT


def query(parameters: list[str]) -> st.SearchStrategy[str]:
    """A query string of some of ``parameters`` (and an unknown one), each with a value."""
    pairs = st.lists(st.tuples(st.sampled_from([*parameters, "bogus"]), VALUES), max_size=4)
    return pairs.map(urlencode)


@pytest.fixture
def rows():
    WorkerNodeFactory(node_id="node-a")
    job = JobDefinitionFactory(name="report", cron="0 9 * * *")
    JobRunFactory(job=job, node="node-a", state=RunState.SUCCEEDED)
    JobRunFactory(job=job, node="node-a", state=RunState.FAILED)


ADMIN_LISTS = {
    "jobdefinition": ["q", "o", "p", "e", "_facets", "all", "source__exact", "enabled__exact",
                      "schedule_kind__exact", "queue"],
    "jobrun": ["q", "o", "p", "e", "_facets", "all", "job", "node", "queue", "state__exact",
               "outcome__exact", "scheduled_at__gte", "scheduled_at__lt", "id__gte"],
    "runevent": ["q", "o", "p", "kind__exact", "run__id__exact"],
    "workernode": ["q", "o", "p", "status__exact"],
    "lease": ["q", "o", "p"],
    "clusterevent": ["q", "o", "p", "kind__exact"],
}  # fmt: skip


def answered(client, path: str) -> int:
    """The status of ``path``, after following Django's own redirect to ``?e=1``."""
    response = client.get(path)
    if response.status_code == 302 and response["Location"].endswith("?e=1"):
        response = client.get(response["Location"])
    return response.status_code


@pytest.mark.parametrize("model", ADMIN_LISTS)
def test_no_admin_list_answers_500(admin_client, rows, model):
    @EXAMPLES
    @given(query(ADMIN_LISTS[model]))
    def ask(text: str) -> None:
        path = f"{reverse(f'admin:cluster_jobs_{model}_changelist')}?{text}"
        assert answered(admin_client, path) < 500, path

    ask()


def with_key(path: str, key: str) -> str:
    """``path`` (reversed with the key 0) with ``key`` in its place, percent-encoded."""
    return path.replace("/0/", f"/{quote(key, safe='')}/", 1)


#: Keys a URL's path can carry (an empty or dot segment is another URL).
KEYS = VALUES.filter(lambda key: key not in ("", ".", ".."))


@pytest.mark.parametrize("model", ADMIN_LISTS)
def test_no_admin_object_page_answers_500(admin_client, rows, model):
    @EXAMPLES
    @given(KEYS)
    def ask(key: str) -> None:
        for view in ("change", "delete", "history"):
            path = with_key(reverse(f"admin:cluster_jobs_{model}_{view}", args=[0]), key)
            assert admin_client.get(path).status_code < 500, path

    ask()


def test_no_occurrence_story_or_overview_answers_500(admin_client, rows):
    @EXAMPLES
    @given(query(["job", "at"]), query(["at", "hours"]))
    def ask(story: str, overview: str) -> None:
        for path in (f"{reverse('admin:cluster_jobs_occurrence')}?{story}",
                     f"{reverse('admin:cluster_jobs_overview')}?{overview}"):  # fmt: skip
            assert answered(admin_client, path) < 500, path

    ask()


API_LISTS = {
    "job-list": ["bogus"],
    "run-list": ["job", "state", "outcome", "node", "since", "cursor", "page_size"],
    "node-list": ["status"],
    "instance-list": ["job", "cursor", "page_size"],
}


@pytest.mark.parametrize("name", API_LISTS)
def test_no_api_list_answers_500(viewer, rows, name):
    @EXAMPLES
    @given(query(API_LISTS[name]))
    def ask(text: str) -> None:
        path = f"{url(name)}?{text}"
        assert viewer.get(path).status_code < 500, path

    ask()


@pytest.mark.parametrize("name", ["job-detail", "run-detail", "node-detail", "instance-detail"])
def test_no_api_detail_answers_500(viewer, rows, name):
    @EXAMPLES
    @given(KEYS)
    def ask(key: str) -> None:
        path = with_key(url(name, 0), key)
        assert viewer.get(path).status_code < 500, path

    ask()

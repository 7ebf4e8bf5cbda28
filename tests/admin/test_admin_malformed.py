"""No admin page answers 500 to a query string or an object id that no row can match: the
changelist treats it as an invalid lookup (Django's redirect to ``?e=1``) or lists nothing, the
change page as an object that does not exist."""

from __future__ import annotations

import pytest

from django_cluster_jobs.admin.runs import JobRunAdmin
from tests.admin.pages import url
from tests.factories import JobDefinitionFactory, JobRunFactory, WorkerNodeFactory

pytestmark = pytest.mark.django_db

#: Values no column can match: beyond a 64-bit integer, not a number, a NUL character (which
#: PostgreSQL's text cannot hold), longer than any column.
MALFORMED = [str(2**64), "9" * 40, "1e400", "-1", "a\x00b", "x" * 5000]
MODELS = ["jobdefinition", "jobrun", "runevent", "workernode", "lease", "clusterevent"]


@pytest.fixture
def runs(monkeypatch):
    monkeypatch.setattr(JobRunAdmin, "list_per_page", 1)  # two pages: the page number is read
    WorkerNodeFactory(node_id="node-a")
    job = JobDefinitionFactory(name="report")  # no malformed value is a part of its name
    return [JobRunFactory(job=job, node="node-a") for _ in range(2)]


def is_invalid_lookup(client, response) -> bool:
    """Django's answer to a lookup it cannot make: the list again, flagged ``?e=1``."""
    if response.status_code != 302:
        return False
    assert response["Location"] == f"{url('jobrun')}?e=1"
    assert client.get(response["Location"]).status_code == 200
    return True


@pytest.mark.parametrize("value", MALFORMED)
@pytest.mark.parametrize("parameter", ["job", "node", "queue", "state__exact"])
def test_a_malformed_runs_filter_is_an_invalid_lookup_or_lists_no_run(
    admin_client, runs, parameter, value
):
    response = admin_client.get(url("jobrun"), {parameter: value})
    if not is_invalid_lookup(admin_client, response):
        assert response.status_code == 200, response.status_code
        assert list(response.context["cl"].result_list) == []


@pytest.mark.parametrize("value", MALFORMED)
def test_a_malformed_job_id_is_refused_before_any_query_facets_included(admin_client, runs, value):
    """The job filter checks its value as the list is built: the facet counts, made while the
    page renders, never see it (an unknown queue empties the list's own query first)."""
    query = {"_facets": "1", "queue": "nosuch", "job": value}
    assert is_invalid_lookup(admin_client, admin_client.get(url("jobrun"), query))


@pytest.mark.parametrize("value", MALFORMED)
def test_a_malformed_search_lists_no_run_or_says_why(admin_client, runs, value):
    response = admin_client.get(url("jobrun"), {"q": value})
    assert response.status_code == 200
    if "\x00" in value:  # Django's search form refuses it, and lists every run
        assert "Null characters are not allowed." in response.content.decode()
    else:
        assert list(response.context["cl"].result_list) == []


@pytest.mark.parametrize("value", MALFORMED)
def test_a_malformed_page_number_is_the_first_page_or_an_invalid_lookup(admin_client, runs, value):
    response = admin_client.get(url("jobrun"), {"p": value})
    if not is_invalid_lookup(admin_client, response):  # a number beyond the last page
        assert response.status_code == 200  # not a number: the first page
        assert response.context["cl"].page_num == 1


@pytest.mark.parametrize("value", MALFORMED)
@pytest.mark.parametrize("model", MODELS)
def test_a_change_page_for_a_malformed_id_says_the_object_does_not_exist(
    admin_client, runs, model, value
):
    response = admin_client.get(url(model, "change", value))
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    messages = [str(m) for m in response.wsgi_request._messages]
    assert any("exist" in m and "deleted" in m for m in messages), messages  # Django's words


def test_a_row_whose_json_python_cannot_read_shows_its_reason(admin_client):
    """JSON nested deeper than Python's decoder follows, written with raw SQL: the job's and the
    run's pages show why it cannot be read, never a 500."""
    from django_cluster_jobs.models import JobDefinition, JobRun
    from tests.raw_rows import store_deep_json

    job = JobDefinitionFactory(name="deep")
    run = JobRunFactory(job=job)
    store_deep_json(JobDefinition, job.pk, "payload")
    store_deep_json(JobRun, run.pk, "payload")
    for page_url in (url("jobdefinition", "change", job.pk), url("jobrun", "change", run.pk),
                     url("jobdefinition"), url("jobrun")):  # fmt: skip
        response = admin_client.get(page_url)
        assert response.status_code == 200, page_url
    assert "unreadable JSON" in admin_client.get(url("jobrun", "change", run.pk)).content.decode()
    assert "unreadable JSON" in (
        admin_client.get(url("jobdefinition", "change", job.pk)).content.decode()
    )

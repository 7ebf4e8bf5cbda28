import pytest

from django_cluster_jobs.models import JobDefinition
from tests.factories import JobDefinitionFactory


@pytest.mark.django_db
def test_factory_creates_a_definition():
    JobDefinitionFactory(name="x")
    assert JobDefinition.objects.filter(name="x").exists()

"""factory-boy factories for the ledger models."""

from datetime import timedelta

import factory
from django.utils import timezone

from django_cluster_jobs import models


class JobDefinitionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.JobDefinition
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"job-{n}")
    callable_name = "tests.manual"
    source = models.Source.DATABASE
    schedule_kind = models.ScheduleKind.CRON
    cron = "* * * * *"
    overlap = models.Overlap.ALLOW


class JobRunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.JobRun

    job = factory.SubFactory(JobDefinitionFactory)
    key = factory.Sequence(lambda n: f"2026-01-01T00:00:{n % 60:02d}.{n:03d}Z")
    scheduled_at = factory.LazyFunction(timezone.now)
    due_at = factory.LazyAttribute(lambda run: run.scheduled_at)
    created_at = factory.LazyFunction(timezone.now)
    state = models.RunState.SUCCEEDED


class RunningRunFactory(JobRunFactory):
    state = models.RunState.RUNNING
    node = "node-a"
    started_at = factory.LazyFunction(timezone.now)
    lease_expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=30))


class RunEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.RunEvent

    run = factory.SubFactory(JobRunFactory)
    at = factory.LazyFunction(timezone.now)
    kind = models.EventKind.CLAIMED
    node = "node-a"


class WorkerNodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.WorkerNode

    node_id = factory.Sequence(lambda n: f"node-{n}")
    host = "localhost"
    pid = factory.Sequence(lambda n: 1000 + n)
    started_at = factory.LazyFunction(timezone.now)
    last_heartbeat = factory.LazyFunction(timezone.now)


class LeaseFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = models.Lease

    name = factory.Sequence(lambda n: f"lease-{n}")

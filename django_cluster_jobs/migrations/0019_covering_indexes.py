"""The two run indexes with covering columns become CoveringIndex: the same indexes in every
database (PostgreSQL built them with INCLUDE, the others, which cannot, on their keys alone), so
only the migration state changes; ``check`` no longer reports models.W040 off PostgreSQL."""

import django_cluster_jobs.indexes
from django.db import migrations, models

OLD = [
    models.Index(
        fields=["job", "-scheduled_at", "-id"],
        include=["state"],
        name="cluster_jobs_run_job_recent",
    ),
    models.Index(
        fields=["-scheduled_at", "-id"],
        include=["job", "state"],
        name="cluster_jobs_run_recent",
    ),
]
NEW = [
    django_cluster_jobs.indexes.CoveringIndex(
        covering=("state",),
        fields=["job", "-scheduled_at", "-id"],
        name="cluster_jobs_run_job_recent",
    ),
    django_cluster_jobs.indexes.CoveringIndex(
        covering=("job", "state"),
        fields=["-scheduled_at", "-id"],
        name="cluster_jobs_run_recent",
    ),
]


class Migration(migrations.Migration):

    dependencies = [
        ("cluster_jobs", "0018_dependencies"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                *(migrations.RemoveIndex(model_name="jobrun", name=i.name) for i in OLD),
                *(migrations.AddIndex(model_name="jobrun", index=i) for i in NEW),
            ],
        ),
    ]

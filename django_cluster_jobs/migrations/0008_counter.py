"""The ledger's named counters: the definitions counter nodes read with their heartbeat."""

from django.db import migrations, models


def create_definitions_counter(apps, schema_editor):
    counters = apps.get_model("cluster_jobs", "Counter").objects.using(schema_editor.connection.alias)
    counters.get_or_create(name="definitions", defaults={"value": 0})


class Migration(migrations.Migration):

    dependencies = [
        ("cluster_jobs", "0007_run_cause"),
    ]

    operations = [
        migrations.CreateModel(
            name="Counter",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("value", models.BigIntegerField(default=0)),
            ],
            options={"verbose_name": "counter"},
        ),
        migrations.RunPython(create_definitions_counter, migrations.RunPython.noop),
    ]

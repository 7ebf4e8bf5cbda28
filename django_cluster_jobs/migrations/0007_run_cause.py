"""Why a run is pending again, as a code the take reads instead of parsing the reason text."""

from django.db import migrations, models

#: The reason texts earlier versions wrote, and the cause each stands for.
PREFIXES = (
    ("lease expired", "lease_expired"),
    ("handed back", "handed_back"),
    ("retry", "retry"),
    ("buffered behind a live run", "buffered"),
)


def causes_from_reasons(apps, schema_editor):
    runs = apps.get_model("cluster_jobs", "JobRun").objects.using(schema_editor.connection.alias)
    for prefix, cause in PREFIXES:
        runs.filter(reason__startswith=prefix, cause="").update(cause=cause)


class Migration(migrations.Migration):

    dependencies = [
        ("cluster_jobs", "0006_operator_acts"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobrun",
            name="cause",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "first attempt"),
                    ("retry", "retry after a failed attempt"),
                    ("lease_expired", "its node's lease expired"),
                    ("handed_back", "handed back by a stopping node"),
                    ("buffered", "buffered behind a live run"),
                ],
                default="",
                help_text="Why the run is pending again (the reason says it in words).",
                max_length=16,
            ),
        ),
        migrations.RunPython(causes_from_reasons, migrations.RunPython.noop, elidable=True),
    ]

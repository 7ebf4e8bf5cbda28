"""Each job's settled_through mark, set from what the ledger already holds."""

from django.db import migrations, models
from django.db.models import Max, Q
from django.utils import timezone


def mark_from_ledger(apps, schema_editor):
    """Settle each job through its latest run (any kind) or its creation, whichever is later.

    Everything before the latest row was decided by the old protocol; occurrences after it have no
    row, so the first leader settles them by the misfire policy, as it always did.
    """
    definitions = apps.get_model("cluster_jobs", "JobDefinition")
    alias, now = schema_editor.connection.alias, timezone.now()
    rows = definitions.objects.using(alias).annotate(
        latest=Max("runs__scheduled_at", filter=Q(runs__scheduled_at__lte=now))
    )
    for pk, created, latest in rows.values_list("pk", "created_at", "latest"):
        mark = max(created, latest) if latest else created
        definitions.objects.using(alias).filter(pk=pk).update(settled_through=mark)


class Migration(migrations.Migration):

    dependencies = [
        ("cluster_jobs", "0004_leaner_claim_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobdefinition",
            name="settled_through",
            field=models.DateTimeField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name="jobdefinition",
            name="revision",
            field=models.PositiveIntegerField(
                default=0,
                editable=False,
                help_text=(
                    "Bumped by every change of what is due; claims planned from an older revision "
                    "are refused, so occurrences after a change follow the new definition only."
                ),
            ),
        ),
        migrations.RunPython(mark_from_ledger, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="jobdefinition",
            name="settled_through",
            field=models.DateTimeField(
                editable=False,
                help_text=(
                    "Cluster time up to which every occurrence is decided (claimed, recorded "
                    "missed, or not due); claims of occurrences at or before it are refused."
                ),
            ),
        ),
        migrations.AlterField(
            model_name="runevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("claimed", "claimed"),
                    ("started", "started"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("retried", "retried"),
                    ("timed_out", "timed out"),
                    ("cancel_req", "cancel requested"),
                    ("cancelled", "cancelled"),
                    ("expired", "lease expired"),
                    ("taken_over", "taken over"),
                    ("lost", "lost"),
                    ("fenced_out", "fenced out"),
                    ("handed_back", "handed back"),
                    ("dead", "dead-lettered"),
                    ("replayed", "replayed"),
                    ("skipped", "skipped"),
                    ("missed", "missed"),
                ],
                max_length=12,
            ),
        ),
    ]

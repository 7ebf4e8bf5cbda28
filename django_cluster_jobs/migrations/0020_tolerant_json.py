"""The JSON columns decode through stored.TolerantDecoder (JSON nested deeper than Python's
decoder follows reads as an Unreadable value): no SQL, only the migration state changes."""

import django_cluster_jobs.stored
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cluster_jobs', '0019_covering_indexes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='jobdefinition',
            name='after',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, default=list, help_text="Names of the jobs that must succeed first, within one workflow instance; the job then runs on demand only (its predecessors' successes queue it)."),
        ),
        migrations.AlterField(
            model_name='jobdefinition',
            name='backoff',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, default=dict),
        ),
        migrations.AlterField(
            model_name='jobdefinition',
            name='payload',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, default=dict),
        ),
        migrations.AlterField(
            model_name='jobdefinition',
            name='requires',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, default=list),
        ),
        migrations.AlterField(
            model_name='jobrun',
            name='args',
            field=models.JSONField(blank=True, db_default=[], decoder=django_cluster_jobs.stored.TolerantDecoder, default=list, help_text="A task's positional arguments."),
        ),
        migrations.AlterField(
            model_name='jobrun',
            name='kwargs',
            field=models.JSONField(blank=True, db_default={}, decoder=django_cluster_jobs.stored.TolerantDecoder, default=dict, help_text="A task's keyword arguments."),
        ),
        migrations.AlterField(
            model_name='jobrun',
            name='payload',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, default=dict),
        ),
        migrations.AlterField(
            model_name='jobrun',
            name='result',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, null=True),
        ),
        migrations.AlterField(
            model_name='jobrun',
            name='trace_context',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name='workernode',
            name='skipped',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, default=dict, help_text='Skips counted by reason.'),
        ),
        migrations.AlterField(
            model_name='workernode',
            name='tags',
            field=models.JSONField(blank=True, decoder=django_cluster_jobs.stored.TolerantDecoder, default=list),
        ),
    ]

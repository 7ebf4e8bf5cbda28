"""delivery="exactly_once": a choice more for the delivery column (no SQL)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cluster_jobs', '0020_tolerant_json'),
    ]

    operations = [
        migrations.AlterField(
            model_name='jobdefinition',
            name='delivery',
            field=models.CharField(choices=[('at_least_once', 'at least once'), ('at_most_once', 'at most once'), ('exactly_once', "exactly once (its writes to the ledger's database)")], default='at_least_once', max_length=14),
        ),
    ]

# What a node reports of a lease's workbench: the published ports (container -> host port) and the image pull's progress (fleet/reports.py).
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0005_ordering_ties'),
    ]

    operations = [
        migrations.AddField(
            model_name='instancereport',
            name='ports',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='instancereport',
            name='pull',
            field=models.JSONField(blank=True, null=True),
        ),
    ]

# Reserved for the workbench's instance reports of published ports and image pulls; filled in by that change.
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

# Reserved for the workbench's GPU telemetry; filled in by that change.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0006_workbench_reports'),
    ]

    operations = []

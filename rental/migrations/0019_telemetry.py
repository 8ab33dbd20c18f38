# Reserved for the workbench's GPU telemetry and idle notices; filled in by that change.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('rental', '0018_teams'),
    ]

    operations = []

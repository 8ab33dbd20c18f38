# Reserved for the workbench's customer images, templates, environment, secrets and ports; filled in by that change.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('rental', '0016_idempotent_requests'),
    ]

    operations = []

# Reserved for the workbench's instance reports of published ports and image pulls; filled in by that change.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0005_ordering_ties'),
    ]

    operations = []

# Reserved for the workbench's teams (account memberships and roles); filled in by that change.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('rental', '0017_workbench'),
    ]

    operations = []

# The account's opt-out of idle-GPU notices (fleet/idle.py).
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('rental', '0018_teams'),
    ]

    operations = [
        migrations.AddField(
            model_name='customersettings',
            name='idle_notices',
            field=models.BooleanField(default=True, help_text="Tell me when a lease's GPUs have been idle"),
        ),
    ]

"""A key of its own for each node and snapshot op, removed once the op is no longer sent (ADR 0010)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0018_payment_review_after_window'),
        ('inventory', '0006_ordering_ties'),
        ('rental', '0015_apitoken_manage_scope'),
    ]

    operations = [
        migrations.CreateModel(
            name='SnapshotNodeKey',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('purpose', models.CharField(choices=[('take', 'Take'), ('restore', 'Restore')], max_length=10)),
                ('access_key', models.CharField(max_length=40, unique=True)),
                ('sealed_secret', models.TextField(blank=True, help_text='rental.sealing; emptied once revoked')),
                ('created_at', models.DateTimeField()),
                ('revoked_at', models.DateTimeField(blank=True, db_index=True, null=True)),
                ('last_error', models.CharField(blank=True, help_text='Why the last removal failed (retried)', max_length=500)),
                ('lease', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='rental.lease')),
                ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='inventory.node')),
                ('snapshot', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='node_keys', to='rental.snapshot')),
            ],
            options={
                'constraints': [models.UniqueConstraint(condition=models.Q(('revoked_at__isnull', True)), fields=('snapshot', 'lease', 'node', 'purpose'), name='one_live_snapshot_node_key')],
            },
        ),
    ]

# GPU telemetry: one row per lease, card and UTC day (docs/adr/0016-gpu-telemetry.md).
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0006_workbench_reports'),
        ('inventory', '0006_ordering_ties'),
    ]

    operations = [
        migrations.CreateModel(
            name='GpuTelemetryDay',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('gpu_index', models.PositiveSmallIntegerField()),
                ('day', models.DateField()),
                ('samples', models.BinaryField(help_text='zlib of five arrays of 1,440: util, temperature, power, SM clock, VRAM')),
                ('events', models.JSONField(blank=True, default=list, help_text='[[minute, "xid", code, n] | [minute, "ecc", corrected, uncorrected]]')),
                ('minutes', models.PositiveSmallIntegerField(default=0, help_text='Minutes of the day with a sample')),
                ('first_minute', models.SmallIntegerField(blank=True, null=True)),
                ('last_minute', models.SmallIntegerField(blank=True, null=True)),
                ('last_busy_minute', models.SmallIntegerField(blank=True, null=True)),
                ('lease', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='gpu_telemetry', to='rental.lease')),
                ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='inventory.node')),
            ],
            options={
                'ordering': ['lease_id', 'day', 'node_id', 'gpu_index'],
                'constraints': [models.UniqueConstraint(fields=('lease', 'node', 'gpu_index', 'day'), name='one_telemetry_row_per_lease_card_day')],
            },
        ),
    ]

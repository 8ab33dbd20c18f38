# The storage models, moved from billing (billing 0020) with their tables (Meta.db_table
# "billing_*"): declared in this app's state only; the tables exist already (ADR 0025).

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


STATE_OPERATIONS = [
    migrations.CreateModel(
        name='NodeStorageKey',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('auth_id', models.CharField(max_length=80, unique=True)),
            ('key', models.CharField(blank=True, max_length=100)),
            ('granted', models.JSONField(blank=True, default=list, help_text='Subvolume names the key reaches now')),
            ('dirty', models.BooleanField(default=True, help_text='Caps to be brought in line with the attachments')),
            ('updated_at', models.DateTimeField(blank=True, null=True)),
            ('last_error', models.CharField(blank=True, max_length=500)),
            ('node', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='storage_key', to='inventory.node')),
        ],
        options={
            'db_table': 'billing_nodestoragekey',
        },
    ),
    migrations.CreateModel(
        name='S3Account',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('uid', models.CharField(max_length=64, unique=True)),
            ('quota_gb', models.PositiveIntegerField(default=1000)),
            ('state', models.CharField(choices=[('active', 'active'), ('closed', 'closed')], default='active', max_length=10)),
            ('simulated', models.BooleanField(default=False)),
            ('created_at', models.DateTimeField()),
            ('metered_at', models.DateTimeField()),
            ('billed_at', models.DateTimeField(help_text='Usage is billed in arrears every 30 days from here')),
            ('bytes_stored', models.BigIntegerField(default=0)),
            ('unbilled_byte_seconds', models.DecimalField(decimal_places=0, default=0, max_digits=30)),
            ('customer', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='s3_accounts', to=settings.AUTH_USER_MODEL)),
            ('site', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='s3_accounts', to='inventory.site')),
        ],
        options={
            'db_table': 'billing_s3account',
        },
    ),
    migrations.CreateModel(
        name='S3Key',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('access_key', models.CharField(max_length=40, unique=True)),
            ('created_at', models.DateTimeField()),
            ('revoked_at', models.DateTimeField(blank=True, null=True)),
            ('account', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='keys', to='storage.s3account')),
        ],
        options={
            'db_table': 'billing_s3key',
        },
    ),
    migrations.CreateModel(
        name='SnapshotMeter',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('accrues_from', models.DateTimeField()),
            ('billed_until', models.DateTimeField(help_text='Usage before this moment is billed')),
            ('billed_byte_seconds', models.DecimalField(decimal_places=0, default=0, max_digits=30)),
            ('billed_cents', models.PositiveIntegerField(default=0)),
            ('unpaid_since', models.DateTimeField(blank=True, help_text='A bill the balance did not cover (lapsed; deleted after the grace)', null=True)),
            ('closed_at', models.DateTimeField(blank=True, help_text='Deleted and billed to its end', null=True)),
            ('snapshot', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='meter', to='rental.snapshot')),
        ],
        options={
            'db_table': 'billing_snapshotmeter',
        },
    ),
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
            'db_table': 'billing_snapshotnodekey',
        },
    ),
    migrations.CreateModel(
        name='SnapshotUsageCharge',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('period_start', models.DateTimeField()),
            ('period_end', models.DateTimeField()),
            ('stored_bytes', models.BigIntegerField()),
            ('byte_seconds', models.DecimalField(decimal_places=0, max_digits=30)),
            ('cents', models.PositiveIntegerField()),
            ('created_at', models.DateTimeField()),
            ('entry', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='snapshot_usage', to='billing.ledgerentry')),
            ('site', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='inventory.site')),
            ('snapshot', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='usage_charges', to='rental.snapshot')),
        ],
        options={
            'db_table': 'billing_snapshotusagecharge',
            'ordering': ['-period_end', '-pk'],
        },
    ),
    migrations.CreateModel(
        name='StorageCharge',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('kind', models.CharField(choices=[('volume', 'network volume'), ('object', 'object storage'), ('snapshot', 'snapshot')], max_length=10)),
            ('object_id', models.PositiveIntegerField()),
            ('entry', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='storage_charge', to='billing.ledgerentry')),
            ('site', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='storage_charges', to='inventory.site')),
        ],
        options={
            'db_table': 'billing_storagecharge',
        },
    ),
    migrations.CreateModel(
        name='StorageCluster',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('mon_host', models.CharField(help_text="Monitor addresses, as in ceph.conf's mon_host", max_length=300)),
            ('client_name', models.CharField(default='client.storefront', max_length=60)),
            ('client_key', models.CharField(blank=True, help_text='cephx secret of the client; blank: CEPH_KEY_<SITE> in the environment', max_length=100)),
            ('fs_name', models.CharField(default='cephfs', max_length=60)),
            ('subvolume_group', models.CharField(default='storefront', max_length=60)),
            ('rgw_endpoint', models.CharField(blank=True, help_text='The S3 endpoint customers use (RGW), e.g. https://s3.dfw-1.example', max_length=200)),
            ('checked_at', models.DateTimeField(blank=True, null=True)),
            ('health', models.CharField(blank=True, max_length=20)),
            ('min_pool_size', models.PositiveSmallIntegerField(blank=True, help_text='Smallest replica count of the volume pools', null=True)),
            ('full', models.BooleanField(default=False)),
            ('alert', models.CharField(blank=True, max_length=300)),
            ('site', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='storage_cluster', to='inventory.site')),
        ],
        options={
            'db_table': 'billing_storagecluster',
        },
    ),
    migrations.CreateModel(
        name='VolumeMount',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('mounted', models.BooleanField(default=False)),
            ('error', models.JSONField(blank=True, null=True)),
            ('first_mounted_at', models.DateTimeField(blank=True, null=True)),
            ('reported_at', models.DateTimeField()),
            ('lease', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='volume_mounts', to='rental.lease')),
            ('volume', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='mounts', to='rental.networkvolume')),
        ],
        options={
            'db_table': 'billing_volumemount',
        },
    ),
    migrations.CreateModel(
        name='VolumeStore',
        fields=[
            ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ('subvolume', models.CharField(max_length=60, unique=True)),
            ('path', models.CharField(blank=True, help_text='Its path in the CephFS', max_length=300)),
            ('quota_bytes', models.BigIntegerField()),
            ('simulated', models.BooleanField(default=False, help_text='Demo: no cluster behind it')),
            ('state', models.CharField(choices=[('ready', 'ready'), ('purging', 'being deleted'), ('purged', 'deleted and purged')], db_index=True, default='ready', max_length=10)),
            ('created_at', models.DateTimeField()),
            ('purged_at', models.DateTimeField(blank=True, null=True)),
            ('attempts', models.PositiveIntegerField(default=0)),
            ('last_error', models.CharField(blank=True, max_length=500)),
            ('next_try_at', models.DateTimeField(blank=True, help_text='A failed purge is retried from then', null=True)),
            ('volume', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='store', to='rental.networkvolume')),
        ],
        options={
            'db_table': 'billing_volumestore',
        },
    ),
    migrations.AddConstraint(
        model_name='s3account',
        constraint=models.UniqueConstraint(fields=('customer', 'site'), name='one_s3_account_per_site'),
    ),
    migrations.AddConstraint(
        model_name='snapshotnodekey',
        constraint=models.UniqueConstraint(condition=models.Q(('revoked_at__isnull', True)), fields=('snapshot', 'lease', 'node', 'purpose'), name='one_live_snapshot_node_key'),
    ),
    migrations.AddConstraint(
        model_name='snapshotusagecharge',
        constraint=models.UniqueConstraint(fields=('snapshot', 'period_start'), name='one_snapshot_charge_per_period'),
    ),
    migrations.AddConstraint(
        model_name='volumemount',
        constraint=models.UniqueConstraint(fields=('volume', 'lease'), name='one_mount_row_per_volume_lease'),
    ),
]


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('billing', '0020_storage_moves_to_its_app'),
        ('inventory', '0007_reboot_burn_in'),
        ('rental', '0019_telemetry'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=STATE_OPERATIONS, database_operations=[]),
    ]

# The storage models move to the storage app (ADR 0025) with their tables: billing forgets
# them here, storage 0001 declares them again; no table is touched.

from django.db import migrations

MOVED = ["S3Key", "S3Account", "NodeStorageKey", "SnapshotMeter", "SnapshotNodeKey", "SnapshotUsageCharge",
         "StorageCharge", "StorageCluster", "VolumeMount", "VolumeStore"]  # S3Key first: it points at S3Account


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0019_snapshot_node_key'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name=name) for name in MOVED],
            database_operations=[],
        ),
    ]

# The moved models' content types (and with them their permissions, already granted to staff
# groups, and the admin's history) follow them from app label "billing" to "storage", instead
# of Django creating new ones with no permission granted (ADR 0025).

from django.db import migrations

MOVED = ["s3key", "s3account", "nodestoragekey", "snapshotmeter", "snapshotnodekey", "snapshotusagecharge",
         "storagecharge", "storagecluster", "volumemount", "volumestore"]


def _relabel(apps, old: str, new: str) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    taken = set(content_type.objects.filter(app_label=new, model__in=MOVED).values_list("model", flat=True))
    content_type.objects.filter(app_label=old, model__in=set(MOVED) - taken).update(app_label=new)


def forwards(apps, schema_editor):
    _relabel(apps, "billing", "storage")


def backwards(apps, schema_editor):
    _relabel(apps, "storage", "billing")


class Migration(migrations.Migration):

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('storage', '0001_initial'),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
    ]

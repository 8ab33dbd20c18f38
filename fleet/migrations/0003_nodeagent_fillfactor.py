"""Every steady report updates its agent's row (the seq guard) without changing an
indexed column, which PostgreSQL does in place (a HOT update) only when the row's page has
room for the new version: 30% of each page is left free for them. No effect on SQLite."""
from django.db import migrations


def _postgresql(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)
    return run


class Migration(migrations.Migration):
    dependencies = [("fleet", "0002_snapshots_evidence_kinds")]

    operations = [
        migrations.RunPython(_postgresql("ALTER TABLE fleet_nodeagent SET (fillfactor = 70)"),
                             _postgresql("ALTER TABLE fleet_nodeagent RESET (fillfactor)"), elidable=False),
    ]

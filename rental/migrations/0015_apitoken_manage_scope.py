"""Instance control (stop, start, restart, restore, auto-renew) became its own API scope,
"manage". A token that held every scope keeps every power; a token without "pay" (one made
for reading or for placing orders) loses instance control, which it should never have had."""
from django.db import migrations, models

ORDER = ["read", "order", "manage", "pay"]


def grant_manage_to_full_tokens(apps, schema_editor):
    ApiToken = apps.get_model("rental", "ApiToken")
    for token in ApiToken.objects.filter(scopes__contains="pay").only("pk", "scopes"):
        held = set(token.scopes.split())
        if {"read", "order", "pay"} <= held and "manage" not in held:
            token.scopes = " ".join(s for s in ORDER if s in held | {"manage"})
            token.save(update_fields=["scopes"])


class Migration(migrations.Migration):

    dependencies = [
        ('rental', '0014_ordering_ties'),
    ]

    operations = [
        migrations.AlterField(
            model_name='apitoken',
            name='scopes',
            field=models.CharField(default='read order manage pay', max_length=40),
        ),
        migrations.RunPython(grant_manage_to_full_tokens, migrations.RunPython.noop),
    ]

"""Deployment check (`manage.py check --deploy`): webhooks never reach private addresses."""
from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.security, deploy=True)
def webhooks_refuse_private_addresses(app_configs, **kwargs):
    if settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES:
        return [Error("WEBHOOK_ALLOW_PRIVATE_ADDRESSES is on: customers' webhook URLs can reach this server's "
                      "own network (server-side request forgery).",
                      hint="Unset it; it exists for the tests' local receiver only.", id="rental.E030")]
    return []

"""Checks of the webhook settings: never private addresses (`check --deploy`), and one attempt per
delivery in flight (always)."""
from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.security, deploy=True)
def webhooks_refuse_private_addresses(app_configs, **kwargs):
    if settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES:
        return [Error("WEBHOOK_ALLOW_PRIVATE_ADDRESSES is on: customers' webhook URLs can reach this server's "
                      "own network (server-side request forgery).",
                      hint="Unset it; it exists for the tests' local receiver only.", id="rental.E030")]
    return []


@register()
def webhook_lease_outlasts_the_deadline(app_configs, **kwargs):
    """A delivery's lease must outlast its attempt's deadline, else the sweep frees a delivery
    whose attempt is still connected and a second attempt starts beside it."""
    deadline, lease = settings.WEBHOOK_ATTEMPT_DEADLINE_SECONDS, settings.WEBHOOK_ATTEMPT_LEASE_SECONDS
    if not 0 < deadline < lease:
        return [Error(f"WEBHOOK_ATTEMPT_LEASE_SECONDS ({lease:g}) must be longer than "
                      f"WEBHOOK_ATTEMPT_DEADLINE_SECONDS ({deadline:g}), which must be above 0.",
                      hint="An attempt still connected when its lease expires would run beside the next one.",
                      id="rental.E031")]
    return []

"""Deployment checks of billing's own settings (`manage.py check --deploy`)."""
from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.security, deploy=True)
def demo_payments_off(app_configs, **kwargs):
    if settings.DEMO_PAYMENTS:
        return [Error("DEMO_PAYMENTS is on: customers can mark their invoices paid without money.",
                      hint="Unset DEMO_PAYMENTS (it is for the embedded `make run` demo only).",
                      id="billing.E001")]
    return []


@register(Tags.security, deploy=True)
def storage_not_simulated(app_configs, **kwargs):
    if settings.STORAGE_SIMULATED:
        return [Error("STORAGE_SIMULATED is on: network volumes, snapshots and object storage are sold "
                      "without a storage cluster behind them.",
                      hint="Unset STORAGE_SIMULATED and set the Ceph cluster (docs: Ceph storage), or sell no storage.",
                      id="billing.E002")]
    return []

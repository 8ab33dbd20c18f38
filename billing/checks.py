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


#: Monero's target block time, for the check below
XMR_BLOCK_MINUTES = 2


@register(Tags.security, deploy=True)
def xmr_settled_watch_within_late_watch(app_configs, **kwargs):
    """Settled quotes stay in the watchers' watch set LATE_PAYMENT_WATCH_DAYS: a longer
    XMR_SETTLED_WATCH_BLOCKS would silently stop looking for a settled payment before its window ends."""
    window_minutes = settings.XMR_SETTLED_WATCH_BLOCKS * XMR_BLOCK_MINUTES
    if window_minutes > settings.LATE_PAYMENT_WATCH_DAYS * 24 * 60:
        return [Error(f"XMR_SETTLED_WATCH_BLOCKS ({settings.XMR_SETTLED_WATCH_BLOCKS} blocks, about "
                      f"{window_minutes // 60} h) is longer than LATE_PAYMENT_WATCH_DAYS "
                      f"({settings.LATE_PAYMENT_WATCH_DAYS} days): settled quotes leave the watch set first.",
                      hint="Lower XMR_SETTLED_WATCH_BLOCKS or raise LATE_PAYMENT_WATCH_DAYS.", id="billing.E003")]
    return []

"""Celery app for tests/faults/test_payment_scan_killed.py: the project's app, plus — once
Django is set up in the worker — an offline LTC adapter (real address derivation, see
tests/billing/payments_helpers.py) whose scan reports every watched quote paid in full and
confirmed, with each quote's apply slowed by SCAN_APPLY_DELAY seconds so the test can
SIGKILL the worker half-way through a scan."""
import hashlib
import os
import time

from celery import signals

from storefront.celery import app  # noqa: F401 - `celery -A tests.faults.scan_worker`


class PayEverything:
    """Wraps a watch-only adapter; scan() finds each watched address paid in full."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def scan(self, watch, cursor):
        from billing.models import Quote
        from billing.payments.coins.base import DetectedPayment, ScanResult

        due = dict(Quote.objects.filter(coin=str(self.inner.coin), address__in=list(watch))
                   .values_list("address", "amount"))
        payments = [DetectedPayment(self.inner.coin, hashlib.sha256(address.encode()).hexdigest(), 0, address,
                                    int(amount), 6, "b" * 64, 100) for address, amount in sorted(due.items())]
        return ScanResult(payments=payments, cursor={"height": 100})


def install():
    from billing.payments import config as coins_config
    from billing.payments import services as payments
    from billing.payments.coins.base import Coin
    from tests.billing.payments_helpers import offline_adapters

    coins_config._override = {Coin.LTC: PayEverything(offline_adapters()[Coin.LTC])}
    delay = float(os.environ.get("SCAN_APPLY_DELAY", "0"))
    if delay:
        real = payments._apply_to_quote

        def slow(*args, **kwargs):
            result = real(*args, **kwargs)
            time.sleep(delay)
            return result

        payments._apply_to_quote = slow


@signals.worker_init.connect
def _on_worker_init(**kwargs):
    import django

    django.setup()
    install()

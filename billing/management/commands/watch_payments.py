"""`manage.py watch_payments [--coin X ...] [--once] [--interval S]`: the payment watchers
outside Celery (or to catch up after downtime): one pass per coin, then repeat."""
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from billing.payments.services import coins_watched
from billing.tasks import watch_payments


class Command(BaseCommand):
    help = "Scan the configured coins' chains for payments to open quotes and apply them."

    def add_arguments(self, parser):
        parser.add_argument("--coin", action="append", help="Only this coin (repeatable).")
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")
        parser.add_argument("--interval", type=float, default=None,
                            help="Seconds between passes (default PAYMENT_WATCH_INTERVAL_SECONDS, as beat's).")

    def handle(self, *args, coin=None, once=False, interval=None, **options):
        interval = settings.PAYMENT_WATCH_INTERVAL_SECONDS if interval is None else interval
        offered = [str(c) for c in coins_watched()]
        wanted = [c.upper() for c in coin] if coin else offered
        if missing := [c for c in wanted if c not in offered]:
            raise CommandError(f"Not configured (or no node to watch with): {', '.join(missing)}. "
                               f"Configured: {', '.join(offered) or 'none'}.")
        while True:
            result = watch_payments.run(wanted)
            for name, touched in result.items():
                self.stdout.write(f"{name}: {touched if isinstance(touched, str) else f'{touched} quote(s) updated'}")
            if once:
                return
            time.sleep(interval)

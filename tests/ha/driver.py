"""The storefront's side of the recovery and failover tests: a process of its own, as a
worker is, pointed at a throwaway cluster by DATABASE_URL. It writes through the real
services — a payment watcher's pass (`payments_apply_scan`, the step after the chain scan)
crediting top-ups, and the lifecycle pass (`run_lifecycle`) renewing and suspending leases —
and prints what it did as JSON for the test to judge.

    python -m tests.ha.driver pay-around N M       # N top-ups, the ledger and time noted, M more
    python -m tests.ha.driver writer STOP PROGRESS # the failover test's writer loop

The writer does what a Celery worker does around each task (Celery's Django fix-up): it
closes a connection that failed before the next pass, so the next pass connects again —
through the multi-host DATABASE_URL, to whichever node accepts writes. A pass that fails is
done again on the next tick, as the next beat tick would: the watcher sees the same payment
again (its cursor did not move), the lifecycle finds the same leases due."""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.test_settings")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import InterfaceError, OperationalError, close_old_connections  # noqa: E402
from django.utils import timezone  # noqa: E402

from billing.models import Invoice, LedgerEntry  # noqa: E402
from billing.payments.services import quote_create  # noqa: E402
from billing.services import balance_top_up, checkout_place_order, topup_invoice_create  # noqa: E402
from rental.services import account_create  # noqa: E402
from tests.billing.payments_helpers import apply, offline_coins, paid  # noqa: E402

DB_ERRORS = (OperationalError, InterfaceError)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P ha@host"
TOPUP_CENTS = 2_500


def payer(i: int):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(username=f"payer{i}").first()
    return user or account_create(username=f"payer{i}", password="ha test password 123", email=f"payer{i}@example.org")


def ledger() -> list[str]:
    from django.db import connection

    from tests.ha.cluster import LEDGER_SQL

    with connection.cursor() as cursor:
        cursor.execute(LEDGER_SQL)
        return [row[0] for row in cursor.fetchall()]


def topup_quote(customer):
    """An open top-up invoice and its USDT quote (pegged: no exchange rate needed)."""
    invoice = topup_invoice_create(customer=customer, amount_cents=TOPUP_CENTS)
    return quote_create(invoice=invoice, coin="USDT", now=timezone.now())


def credit(quote) -> None:
    """One watcher pass that finds the quote paid in full and confirmed: the invoice is paid
    and the balance credited (one ledger entry, keyed, so a repeat credits nothing)."""
    apply(quote, [paid(quote, int(quote.amount), 12, tx=f"{quote.pk:064x}")], timezone.now())


def cmd_pay_around(before: int, after: int) -> None:
    """`before` top-ups credited; the ledger and the database's clock noted; `after` more."""
    from django.db import connection

    with offline_coins():
        for i in range(before):
            credit(topup_quote(payer(i % 3)))
        snapshot = ledger()
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()::text")
            [(target,)] = cursor.fetchall()
        for i in range(after):
            credit(topup_quote(payer(i % 3)))
    print(json.dumps({"before": snapshot, "target": target, "after": ledger()}))


# --- the failover writer ------------------------------------------------------------------

#: virtual seconds of the lifecycle's clock per real second: a day of renewals in seconds
SPEED = 7200


def seed_leases(n: int):
    """n active one-week leases; the even ones' balance covers a renewal, the odd ones' not.
    Their terms end between 26 and 46 virtual hours from now, so the lifecycle issues and
    pays renewals (24 h before the end) and suspends the unpaid (at the end) while the
    writer runs: before, during and after the failover."""
    from inventory.demo import load_demo_catalog
    from inventory.models import Offer, Site
    from ops.lifecycle import run_lifecycle
    from rental.demo import load_demo_images
    from rental.models import Image, Lease

    load_demo_catalog()
    load_demo_images()
    offer, image = Offer.objects.get(slug="rtx-3090"), Image.objects.get(slug="pytorch-2.5-cuda-12.4")
    sites, start = list(Site.objects.all()), timezone.now() - timedelta(days=7)
    ids = []
    for i in range(n):
        customer = account_create(username=f"lessee{i}", password="ha test password 123",
                                  email=f"lessee{i}@example.org")
        balance_top_up(customer=customer, amount_cents=(2 if i % 2 == 0 else 1) * offer.weekly_cents, now=start)
        lease, _ = checkout_place_order(customer=customer, offer=offer, site=sites[i % len(sites)], term="week",
                                        image=image, ssh_public_key=KEY, pay_from_balance=True, now=start)
        ids.append(lease.pk)
    run_lifecycle(start)  # the fake host agent (no delay) provisions them
    now, ends = timezone.now(), {}
    for i, pk in enumerate(ids):
        end = now + timedelta(hours=26 + 20 * i / max(1, n - 1))
        Lease.objects.filter(pk=pk).update(started_at=end - timedelta(days=7), ends_at=end)
        ends[pk] = end
    return now, ends


def cmd_writer(stop: Path, progress: Path, leases: int = 8) -> None:
    from ops.lifecycle import run_lifecycle

    settings.HOST_AGENT_FAKE_DELAY = 0
    v0, ends = seed_leases(leases)
    v_final = max(ends.values()) + timedelta(hours=1)
    started = time.monotonic()
    out = open(progress, "a", buffering=1)  # noqa: SIM115
    state = {"quote": None, "made": [], "ok": [], "errors": 0, "lifecycle_ok": 0}

    def note(**event):
        out.write(json.dumps({"t": time.time(), **event}) + "\n")

    def tick(work) -> bool:
        close_old_connections()  # what Celery's Django fix-up does before each task
        try:
            work()
            return True
        except DB_ERRORS as error:
            state["errors"] += 1
            note(error=str(error).splitlines()[0][:200])
            return False
        finally:
            close_old_connections()  # ... and after it

    def watcher_pass():
        if state["quote"] is None:  # an invoice and quote of its own before it can be paid
            quote = topup_quote(payer(len(state["made"]) % 3))
            state["quote"] = quote
            state["made"].append(quote.invoice_id)
        credit(state["quote"])
        state["ok"].append(state["quote"].invoice_id)
        note(ok=state["quote"].invoice_id)
        state["quote"] = None

    def lifecycle_pass(now):
        run_lifecycle(now)
        state["lifecycle_ok"] += 1

    note(ready=True)
    with offline_coins():
        while not stop.exists():
            tick(watcher_pass)
            virtual = min(v0 + timedelta(seconds=(time.monotonic() - started) * SPEED), v_final)
            tick(lambda v=virtual: lifecycle_pass(v))
            time.sleep(0.05)  # a worker's tick, not a wait for anything
        while not tick(lambda: lifecycle_pass(v_final)):  # the pass that finds nothing left to do
            time.sleep(0.2)
    out.close()
    print(json.dumps(report(state, ends)))


def report(state: dict, ends: dict) -> dict:
    from collections import Counter

    from rental.models import Lease, LeaseEvent, Notification

    credits = Counter(LedgerEntry.objects.filter(invoice_id__in=state["made"]).values_list("invoice_id", flat=True))
    leases = {}
    for lease in Lease.objects.filter(pk__in=list(ends)):
        leases[lease.pk] = {
            "state": lease.state,
            "renewed_by_days": round((lease.ends_at - ends[lease.pk]).total_seconds() / 86400, 3),
            "renewal_invoices": Invoice.objects.filter(lease=lease, kind="renewal").count(),
            "renewals_paid": Invoice.objects.filter(lease=lease, kind="renewal", state="paid").count(),
            "renewal_charges": LedgerEntry.objects.filter(kind="renewal", account__customer=lease.customer_id).count(),
            "suspended_events": LeaseEvent.objects.filter(lease=lease, kind="suspended").count(),
            "notices": sorted(Notification.objects.filter(lease=lease).values_list("kind", flat=True)),
        }
    mails = []
    for path in Path(settings.EMAIL_FILE_PATH).glob("*"):
        for message in path.read_text(errors="replace").split("-" * 79):  # the file backend's separator
            headers, _, body = message.strip().partition("\n\n")
            fields = dict(line.split(": ", 1) for line in headers.splitlines() if ": " in line)
            if fields:
                mails.append([fields.get("To", ""), fields.get("Subject", ""), body.strip()])
    outbox = [[n.customer.email, n.subject, n.body.strip()]
              for n in Notification.objects.filter(lease_id__in=list(ends)).select_related("customer")]
    return {"made": state["made"], "ok": state["ok"], "errors": state["errors"], "lifecycle_ok": state["lifecycle_ok"],
            "credits": {str(k): v for k, v in credits.items()}, "leases": leases, "mails": mails,
            "outbox": outbox}


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "pay-around":
        cmd_pay_around(int(args[0]), int(args[1]))
    elif command == "writer":
        cmd_writer(Path(args[0]), Path(args[1]))
    else:
        raise SystemExit(__doc__)

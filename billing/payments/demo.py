"""Demo payment mode: with DEMO_PAYMENTS on (the embedded `make run` store), a customer
can settle their own open invoice without money, so the whole path order → pay →
provisioning → SSH can be tried on a laptop. Every page says the store is a demo while it
is on, and `manage.py check --deploy` refuses it (billing/checks.py)."""
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils.translation import gettext as _

from inventory.audit import audit_record

from ..models import Invoice, Quote, WatcherCursor
from ..services import BillingError, invoice_mark_paid


def demo_payments_enabled() -> bool:
    return bool(settings.DEMO_PAYMENTS)


def invoice_pay_demo(*, invoice: Invoice, actor: User, now: datetime) -> bool:
    """Mark the customer's own open invoice paid 'via demo'; refused unless demo mode is on."""
    with transaction.atomic():
        if not demo_payments_enabled():
            raise BillingError(_("Demo payments are off on this store."))
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if invoice.customer_id != actor.pk or invoice.state != Invoice.State.OPEN:
            raise BillingError(_("Only an open invoice of your own can be paid."))
        paid = invoice_mark_paid(invoice=invoice, via="demo", now=now, actor=actor, note="demo payment (no money)")
        audit_record(actor=actor, action="invoice_paid_demo", obj=invoice, detail={"amount_cents": invoice.amount_cents})
        return paid


def demo_coin_send(*, quote: Quote, actor: User, now: datetime) -> dict:
    """The demo wallet pays the customer's own open DEMO quote in full: one transaction on the
    demo coin's chain (its watcher cursor), which the watcher's pass reports and the payment
    services credit exactly as they credit a BTC payment. Refused unless demo mode is on."""
    from .coins.base import Coin
    from .coins.demo import demo_transaction
    from .services import OPEN_QUOTE_STATES

    with transaction.atomic():
        if not demo_payments_enabled():
            raise BillingError(_("Demo payments are off on this store."))
        quote = Quote.objects.select_for_update().select_related("invoice").get(pk=quote.pk)
        if quote.coin != Coin.DEMO or quote.invoice.customer_id != actor.pk or quote.state not in OPEN_QUOTE_STATES:
            raise BillingError(_("Only an open demo-coin quote of your own can be paid by the demo wallet."))
        cursor = WatcherCursor.objects.get_or_create(coin=Coin.DEMO)[0]
        cursor = WatcherCursor.objects.select_for_update().get(pk=cursor.pk)
        chain = list((cursor.cursor or {}).get("chain", []))
        tx = demo_transaction(address=quote.address, amount=int(quote.amount), sequence=len(chain), time=int(now.timestamp()))
        chain.append(tx)
        WatcherCursor.objects.filter(pk=cursor.pk).update(cursor={**(cursor.cursor or {}), "chain": chain})
        audit_record(actor=actor, action="demo_coin_sent", obj=quote, detail={"amount": int(quote.amount), "txid": tx["txid"]})
        return tx

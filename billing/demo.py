"""Demo payment mode: with DEMO_PAYMENTS on (the embedded `make run` store), a customer
can settle their own open invoice without money, so the whole path order → pay →
provisioning → SSH can be tried on a laptop. Every page says the store is a demo while it
is on, and `manage.py check --deploy` refuses it (billing/checks.py)."""
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils.translation import gettext as _

from inventory.services import audit_record

from .models import Invoice
from .services import BillingError, invoice_mark_paid


def demo_payments_enabled() -> bool:
    return bool(settings.DEMO_PAYMENTS)


@transaction.atomic
def invoice_pay_demo(*, invoice: Invoice, actor: User, now: datetime) -> bool:
    """Mark the customer's own open invoice paid 'via demo'; refused unless demo mode is on."""
    if not demo_payments_enabled():
        raise BillingError(_("Demo payments are off on this store."))
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if invoice.customer_id != actor.pk or invoice.state != Invoice.State.OPEN:
        raise BillingError(_("Only an open invoice of your own can be paid."))
    paid = invoice_mark_paid(invoice=invoice, via="demo", now=now, actor=actor, note="demo payment (no money)")
    audit_record(actor=actor, action="invoice_paid_demo", obj=invoice, detail={"amount_cents": invoice.amount_cents})
    return paid

"""`manage.py settle_invoice ID --note TEXT`: mark an invoice paid outside the platform
(bank transfer, cash) with the operator's note; its lease gets its term."""
from django.core.management.base import BaseCommand, CommandError

from billing.models import Invoice
from billing.services import BillingError, invoice_settle_manually


class Command(BaseCommand):
    help = "Settle an open invoice manually, with a note saying why and how it was paid."

    def add_arguments(self, parser):
        parser.add_argument("invoice_id", type=int)
        parser.add_argument("--note", required=True, help="Why and how it was paid (kept on the invoice)")
        parser.add_argument("--operator", default="", help="Username recorded as the settling operator")

    def handle(self, *args, invoice_id, note, operator="", **options):
        if not note.strip():
            raise CommandError("--note must say why the invoice is settled manually.")
        try:
            invoice = Invoice.objects.get(pk=invoice_id)
        except Invoice.DoesNotExist as exc:
            raise CommandError(f"There is no invoice #{invoice_id}.") from exc
        actor = None
        if operator:
            from django.contrib.auth.models import User

            actor = User.objects.filter(username=operator, is_staff=True).first()
            if actor is None:
                raise CommandError(f"No staff user {operator!r}.")
        if invoice.state == Invoice.State.PAID:
            raise CommandError(f"Invoice #{invoice.pk} is already paid "
                               f"({invoice.paid_via or 'unknown'}, {invoice.paid_at:%Y-%m-%d %H:%M} UTC).")
        if invoice.state != Invoice.State.OPEN:
            raise CommandError(f"Invoice #{invoice.pk} is {invoice.get_state_display()}, not open: nothing to settle.")
        try:
            settled = invoice_settle_manually(invoice=invoice, actor=actor, note=note)
        except BillingError as exc:
            raise CommandError(str(exc)) from exc
        if not settled:
            raise CommandError(f"Invoice #{invoice.pk} was settled or closed meanwhile; nothing done.")
        invoice.refresh_from_db()
        where = f" (lease #{invoice.lease_id})" if invoice.lease_id else ""
        self.stdout.write(f"Invoice #{invoice.pk}{where} settled manually: ${invoice.amount_cents / 100:,.2f}.")

"""The order page's "network volume" add-on: the volume is created when the order is paid,
through the same service as My storage (storage.volumes.volume_provision), and
attached to the new lease through its desired state. From then on it is an ordinary volume:
paid for the lease's first term by the order invoice, renewed on its own term from the
balance, kept when the lease ends — so the lease's own renewals no longer include it.

If the site's storage cannot create it (down, full, below three replicas), nothing is
charged for it: the add-on's part of the invoice goes back to the balance (a refund entry
keyed `ordered_volume:<lease>`, so once), the customer gets a notice and the cluster's
alert is on the ops dashboard. A row left pending by anything else (a crash between the
payment and the Ceph call) is retried by the storage sweep."""
import logging
import re
from datetime import datetime, timedelta

from django.db import transaction
from django.utils.translation import gettext as _

from billing.addons import AddonHandler
from billing.models import Invoice, InvoiceLine, LedgerEntry, OrderedVolume
from core.money import format_usd
from inventory.services import audit_record
from rental import services as rental
from rental.models import Lease, LeaseState
from rental.storage import StorageRefused, lease_volume_addon_settled, volume_attach

from .volumes import StorageUnavailable, volume_attachments_changed, volume_provision

log = logging.getLogger(__name__)
#: the order invoice's line of the add-on, as billing.services.price_lines stores it (English)
VOLUME_LINE = re.compile(r"^Network volume, .+, per TB$")
ATTACHABLE = (LeaseState.PROVISIONING, LeaseState.ACTIVE)


class _Settled(Exception):
    """Another run settled the row first (the subvolume just made is removed again)."""


def addon_cents(invoice: Invoice) -> int:
    return sum(line.amount_cents for line in InvoiceLine.objects.filter(invoice=invoice)
               if VOLUME_LINE.match(line.description))


def ordered_volume_due(*, invoice: Invoice, now: datetime) -> OrderedVolume | None:
    """An order invoice was paid and its lease started: record its volume add-on (once)
    and create it once the payment has committed."""
    lease = Lease.objects.get(pk=invoice.lease_id)
    cents = addon_cents(invoice)
    if not lease.network_volume_tb or not cents:
        return None
    row, created = OrderedVolume.objects.get_or_create(
        lease=lease, defaults={"invoice": invoice, "size_tb": lease.network_volume_tb, "cents": cents,
                               "created_at": now})
    if created:
        audit_record(actor=None, action="ordered_volume_due", obj=row,
                     detail={"lease": lease.pk, "invoice": invoice.pk, "size_tb": row.size_tb, "cents": cents}, at=now)
        transaction.on_commit(lambda: ordered_volume_settle(row=row, now=now))
    return row


def ordered_volume_settle(*, row: OrderedVolume, now: datetime) -> str:
    """Create the volume and attach it to the lease, or refund the add-on when the
    storage cannot take it. Idempotent; returns the row's state."""
    row = OrderedVolume.objects.select_related("lease__site", "lease__customer").get(pk=row.pk)
    if row.state != OrderedVolume.State.PENDING:
        return row.state
    lease = row.lease
    if lease.state not in ATTACHABLE:
        return ordered_volume_refund(row=row, now=now, reason=f"lease #{lease.pk} is {lease.state}")

    def record(volume):
        if not OrderedVolume.objects.filter(pk=row.pk, state=OrderedVolume.State.PENDING).update(
                state=OrderedVolume.State.CREATED, volume=volume, settled_at=now):
            raise _Settled
        volume_attach(volume=volume, lease=lease, now=now)
        lease_volume_addon_settled(lease_id=lease.pk, cents=row.cents, now=now,
                                   outcome=f"network volume #{volume.pk} created")
        audit_record(actor=None, action="ordered_volume_created", obj=row,
                     detail={"lease": lease.pk, "volume": volume.pk, "size_tb": row.size_tb}, at=now)

    try:
        volume = volume_provision(customer=lease.customer, site=lease.site, name=f"lease-{lease.pk}",
                                  size_tb=row.size_tb, now=now, charge=record,
                                  term=timedelta(days=_term_days(lease)))
    except _Settled:
        return OrderedVolume.objects.get(pk=row.pk).state
    except (StorageUnavailable, StorageRefused) as exc:
        return ordered_volume_refund(row=row, now=now, reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - left pending: the storage sweep tries again
        OrderedVolume.objects.filter(pk=row.pk).update(attempts=row.attempts + 1, reason=str(exc)[:300])
        log.exception("lease %s: ordered network volume not created yet", lease.pk)
        return OrderedVolume.State.PENDING
    volume_attachments_changed(volume=volume, now=now)
    return OrderedVolume.State.CREATED


def _term_days(lease: Lease) -> int:
    from billing.ledger import TERM_DAYS

    return TERM_DAYS[lease.term]


@transaction.atomic
def ordered_volume_refund(*, row: OrderedVolume, now: datetime, reason: str, tell_customer: bool = True) -> str:
    """Not created: the add-on's part of the invoice back to the balance, once, with an
    audit row and a notice; the lease's renewals no longer include it."""
    from billing.ledger import ledger_post

    claimed = _not_created(row=row, now=now, reason=reason)
    if claimed is None:
        return OrderedVolume.objects.get(pk=row.pk).state
    lease, taken, touched = claimed
    if taken:
        ledger_post(customer=lease.customer, kind=LedgerEntry.Kind.REFUND, amount_cents=taken, now=now,
                    invoice=touched[0], memo=f"network volume add-on of lease #{lease.pk} not created",
                    idempotency_key=f"ordered_volume:{lease.pk}")
    if tell_customer and lease.state in ATTACHABLE:
        _notify_not_created(lease, size_tb=row.size_tb, cents=taken, now=now)
    return OrderedVolume.State.REFUNDED


def _not_created(*, row: OrderedVolume, now: datetime, reason: str):
    """Marks the add-on refunded (once: None when it was settled already) and takes its
    part of the invoice; returns (lease, cents taken, invoices touched) for the caller to
    post."""
    from billing.ledger import invoices_refund_claim

    if not OrderedVolume.objects.filter(pk=row.pk, state=OrderedVolume.State.PENDING).update(
            state=OrderedVolume.State.REFUNDED, reason=reason[:300], settled_at=now):
        return None
    lease = Lease.objects.select_related("customer", "site").get(pk=row.lease_id)
    taken, touched = invoices_refund_claim(invoices=[row.invoice], now=now, cents=row.cents)
    lease_volume_addon_settled(lease_id=lease.pk, cents=row.cents, now=now, outcome="network volume not created")
    audit_record(actor=None, action="ordered_volume_refunded", obj=row,
                 detail={"lease": lease.pk, "refunded_cents": taken, "reason": reason[:300]}, at=now)
    return lease, taken, touched


def _notify_not_created(lease: Lease, *, size_tb: int, cents: int, now: datetime) -> None:
    args = {"id": lease.pk, "site": lease.site.code, "size": size_tb, "amount": format_usd(cents)}
    with rental.customer_language(lease.customer):
        rental.notify(lease=lease, kind="volume_not_created", deadline=now, now=now,
                      subject=_("Lease #%(id)s: the network volume could not be created") % args,
                      body=_("The storage at %(site)s could not create the %(size)s TB network volume ordered with "
                             "lease #%(id)s (it is down or full right now). Nothing is charged for it: %(amount)s is "
                             "back on your balance. Your instance is not affected; you can add a volume from My "
                             "storage later.") % args)


def ordered_volume_pending_cents(lease: Lease) -> int:
    """The add-on's part of a lease still waiting for its volume (a refund of the lease
    cancels it first and returns it: ordered_volume_cancel)."""
    return sum(OrderedVolume.objects.filter(lease=lease, state=OrderedVolume.State.PENDING)
               .values_list("cents", flat=True))


def lease_volume_addon_cents(lease: Lease) -> int:
    """The network volume add-on's part still inside the lease's price: before the order is
    paid (its invoice line) and while the volume is being created. Once the volume exists or
    the add-on is refunded, the lease's price no longer holds it (lease_volume_addon_settled)."""
    row = OrderedVolume.objects.filter(lease=lease).only("state", "cents").first()
    if row is not None:
        return row.cents if row.state == OrderedVolume.State.PENDING else 0
    if not lease.network_volume_tb:
        return 0
    order = Invoice.objects.filter(lease=lease, kind=Invoice.Kind.ORDER).order_by("pk").first()
    return addon_cents(order) if order is not None else 0


def ordered_volume_cancel(*, lease: Lease, now: datetime) -> tuple[int, list]:
    """The lease is refunded or failed before its volume was created: the add-on is
    settled as not created (and never created later). Returns (cents taken, invoices
    touched): the lease's refund posts them with the rest, as one refund the customer is
    told of and the monthly allowance counts once."""
    taken, touched = 0, []
    for row in OrderedVolume.objects.filter(lease=lease, state=OrderedVolume.State.PENDING):
        claimed = _not_created(row=row, now=now, reason="the lease ended before its volume was created")
        if claimed is not None:
            taken += claimed[1]
            touched += claimed[2]          # the lease's refund keeps one of each invoice
    return taken, touched


#: billing calls these through its extension point (billing.addons; registered in StorageConfig.ready)
ORDERED_VOLUME = AddonHandler(name="ordered_volume", paid=ordered_volume_due, cancel=ordered_volume_cancel,
                              pending_cents=ordered_volume_pending_cents, price_cents=lease_volume_addon_cents)


def ordered_volumes_retry(*, now: datetime, older_than: timedelta, limit: int) -> list[str]:
    """Rows a crash left pending (the sweep's part)."""
    pending = OrderedVolume.objects.filter(state=OrderedVolume.State.PENDING, created_at__lte=now - older_than)
    return [f"lease #{row.lease_id}: ordered volume {ordered_volume_settle(row=row, now=now)}"
            for row in pending.order_by("pk")[:limit]]

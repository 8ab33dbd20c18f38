"""Scenes of the customer's day shared by the page tests and the browser tests:
a running lease, an incident on its node, its migration, a renewal invoice."""
from datetime import datetime, timedelta

from django.utils import timezone

from tests.factories import ED25519


def running_lease(customer, *, slug="rtx-3090", term="week", now: datetime | None = None):
    """Ordered, paid from the balance and provisioned (FakeAgent, no delay): active."""
    from billing.services import balance_top_up, checkout_place_order, price_lines
    from inventory.models import Offer, Site
    from ops.lifecycle import run_lifecycle
    from rental.models import Image, Lease

    now = now or timezone.now()
    offer = Offer.objects.get(slug=slug)
    cost = sum(line.amount_cents for line in price_lines(offer=offer, term=term, addons={}))
    balance_top_up(customer=customer, amount_cents=cost, now=now)
    lease, _ = checkout_place_order(customer=customer, offer=offer, site=Site.objects.get(code="DFW-1"), term=term,
                                    image=Image.objects.filter(vendor=offer.gpu_model.vendor).first(),
                                    ssh_public_key=ED25519, pay_from_balance=True, now=now)
    run_lifecycle(now + timedelta(seconds=1))
    return Lease.objects.get(pk=lease.pk)


def node_of(lease):
    from inventory.models import SlotAllocation

    return SlotAllocation.objects.get(lease_id=lease.pk, released_at__isnull=True).slot.node


def node_down(lease, *, minutes_ago=5, operator=None):
    """The operator opens a 'down' incident on the lease's node and its customers are told."""
    from inventory.incidents import incident_open
    from rental.failover import incident_notify_customers

    incident = incident_open(node=node_of(lease), kind="down", reason="PSU failure", actor=operator,
                             starts_at=timezone.now() - timedelta(minutes=minutes_ago))
    incident_notify_customers(incident=incident)
    return incident


def renewal_due(lease):
    """The renewal invoice the lifecycle creates 24 h before the term ends."""
    from django.conf import settings

    from billing.models import Invoice
    from ops.lifecycle import run_lifecycle

    run_lifecycle(lease.ends_at - timedelta(hours=settings.LEASE_RENEWAL_LEAD_HOURS) + timedelta(minutes=1))
    return Invoice.objects.get(lease=lease, kind=Invoice.Kind.RENEWAL)

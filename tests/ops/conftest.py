from datetime import timedelta

import pytest
from django.utils import timezone

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


@pytest.fixture
def t0():
    return timezone.now().replace(microsecond=0) - timedelta(days=60)


@pytest.fixture
def place(settings):
    """Order, pay from the balance and provision a lease at `at`; returns it active."""
    from billing.services import balance_top_up, checkout_place_order, price_lines
    from inventory.models import Offer, Site
    from ops.lifecycle import run_lifecycle
    from rental.models import Image

    settings.HOST_AGENT_FAKE_DELAY = 0

    def _place(customer, at, *, offer="rtx-3090", site="DFW-1", term="month", addons=None, activate=True):
        offer = Offer.objects.get(slug=offer)
        addons = addons or {}
        cost = sum(line.amount_cents for line in price_lines(offer=offer, term=term, addons=addons))
        balance_top_up(customer=customer, amount_cents=cost, now=at)
        lease, invoice = checkout_place_order(
            customer=customer, offer=offer, site=Site.objects.get(code=site), term=term,
            image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY, addons=addons,
            pay_from_balance=True, now=at)
        # auto_now_add stamps the real clock; the scenario's clock is `at`.
        from inventory.models import SlotAllocation
        from rental.models import Lease
        SlotAllocation.objects.filter(lease_id=lease.pk).update(allocated_at=at)
        Lease.objects.filter(pk=lease.pk).update(created_at=at)
        if activate:
            from rental.lifecycle import sweep_provisioning
            sweep_provisioning(at)
        lease.refresh_from_db()
        return lease

    _place.run_lifecycle = run_lifecycle
    return _place


@pytest.fixture
def op_client(client, operator):
    client.force_login(operator)
    return client

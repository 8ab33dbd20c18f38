"""Every customer page fits a 390 px phone in the states the issue found overflowing: the
crypto checkout with a payment seen, a lease stopped by its customer while its site has an
open incident, a pending order, My storage, the SLA claims and the invoices."""
from django.urls import reverse
from django.utils import timezone

from tests.e2e.conftest import PHONE, login, screenshot
from tests.e2e.helpers import _customer

OVERFLOWING = """() => [...document.querySelectorAll('main *')]
  .filter(e => !e.closest('.table-scroll') && e.getBoundingClientRect().right > innerWidth + 1)
  .slice(0, 5).map(e => e.tagName + '.' + e.className + ': ' + Math.round(e.getBoundingClientRect().right))"""


def test_customer_pages_fit_390_px_in_every_state(new_context, shop):
    from billing.payments.services import quote_create
    from billing.services import checkout_place_order
    from fleet.instances.views import ACTIONS
    from inventory.incidents import incident_open
    from inventory.models import Offer, Site
    from rental.models import Image
    from tests.automation.helpers import KEY, active_lease
    from tests.billing.payments_helpers import apply, offline_coins, paid, set_rate

    user = _customer("pat")
    now = timezone.now()
    set_rate("LTC", "80", now)
    running = active_lease(user, now)
    ACTIONS["stop"][0](lease_id=running.pk, customer=user, now=now)
    incident_open(starts_at=now, reason="power", site=Site.objects.get(code="DFW-1"))
    with offline_coins():
        pending, invoice = checkout_place_order(
            customer=user, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code="IAD-1"),
            term="week", image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY)
        quote = quote_create(invoice=invoice, coin="LTC", now=now)
        apply(quote, [paid(quote, int(quote.amount) // 2, 0)], now)  # a payment seen, not enough yet
        page = new_context(viewport=PHONE).new_page()
        login(page, "pat")
        for name, url in [("quote", reverse("payments:quote", args=[quote.pk])),
                          ("stopped-lease", reverse("lease_detail", args=[running.pk])),
                          ("pending-lease", reverse("lease_detail", args=[pending.pk])),
                          ("storage", reverse("storage_mine:index")), ("sla", reverse("sla:claims")),
                          ("invoices", reverse("billing:invoices")), ("leases", reverse("lease_list"))]:
            page.goto(url)
            wide = page.evaluate(OVERFLOWING)
            if wide:
                screenshot(page, f"phone-{name}")
            assert not wide and page.evaluate("document.documentElement.scrollWidth <= innerWidth + 1"), (name, wide)
        page.goto(reverse("payments:quote", args=[quote.pk]))
        assert page.locator("table.payments").count() == 1  # the state under test: a payment seen

"""The lease page as it lives, in a real browser at 1280 and 390 px with
screenshots: the demo store's real crypto checkout with its DEMO coin, the lease page that
updates as a whole while provisioning and stops polling after, an incident banner and the
header's notice count, the migration note arriving by itself, the renewal call to action,
the refund limit where no refund is left, and the one-time API token box on a phone."""
import re

import pytest
from django.utils import timezone

from tests.e2e.conftest import DESKTOP, PASSWORD, PHONE, login, ms, screenshot
from tests.e2e.helpers import no_horizontal_overflow
from tests.experience.scenes import node_down, renewal_due, running_lease

VIEWPORTS = [(DESKTOP, "desktop"), (PHONE, "phone")]


@pytest.fixture
def demo_store(shop, settings):
    settings.DEMO_PAYMENTS = True
    settings.HOST_AGENT_FAKE_DELAY = 0
    return shop


def _customer(name):
    from rental.services import account_create

    return account_create(username=name, password=PASSWORD)


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_demo_checkout_then_the_lease_page_updates_itself_and_stops_polling(new_context, demo_store, viewport, tag):
    from billing.models import Invoice
    from ops.lifecycle import run_lifecycle
    from rental.models import Lease, LeaseState
    from tests.e2e.helpers import SSH_KEY

    _customer(f"gina{tag}")
    page = new_context(viewport=viewport).new_page()
    login(page, f"gina{tag}")
    page.goto("/order/rtx-3090/")
    page.fill("#id_ssh_public_key", SSH_KEY)
    page.get_by_role("button", name="Place order").click()
    page.wait_for_url(re.compile(r"/leases/\d+/$"))
    lease = Lease.objects.get(customer__username=f"gina{tag}")
    invoice = Invoice.objects.get(lease=lease)
    page.goto(f"/billing/invoices/{invoice.pk}/")
    page.get_by_role("link", name="Pay with DEMO").click()
    page.get_by_label(re.compile(r"Demo coin \(no value\)")).check()
    page.get_by_role("button", name="Get the payment address").click()
    page.wait_for_url(re.compile(r"/pay/quote/\d+/$"))
    assert page.get_by_text("DEMO — not a real address").is_visible()
    assert page.locator("figure.qr-demo svg").is_visible()
    assert page.locator("#quote-address").inner_text().startswith("DEMO-NOT-A-REAL-ADDRESS-")
    assert no_horizontal_overflow(page)
    screenshot(page, f"demo-quote-{tag}")
    page.get_by_role("button", name=re.compile(r"Send .* DEMO from the demo wallet")).click()
    page.get_by_text("Paid. Thank you!").wait_for()
    invoice.refresh_from_db()
    assert invoice.state == Invoice.State.PAID and invoice.paid_via == "DEMO"

    page.get_by_role("link", name="Go to your lease").click()
    live = page.locator("#lease-live")
    assert live.get_attribute("hx-trigger") == "every 3s"  # provisioning: the region polls
    run_lifecycle(timezone.now())  # the host becomes ready while the customer watches
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE
    # No reload: the status, the connection line and the event log all arrive in the region.
    page.get_by_text("Your instance is running.").wait_for(timeout=ms(15))
    page.get_by_text("Instance ready for SSH").first.wait_for()
    assert page.locator("#ssh-line").input_value() == lease.ssh_command
    assert page.locator("#lease-live").get_attribute("hx-trigger") is None  # nothing in progress: stopped
    assert no_horizontal_overflow(page)
    screenshot(page, f"lease-live-ready-{tag}")


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_incident_banner_notice_count_and_the_migration_note_arrive_on_the_lease_page(new_context, shop, settings,
                                                                                      viewport, tag):
    from rental.failover import incident_migrate
    from rental.models import Notification

    settings.HOST_AGENT_FAKE_DELAY = 0
    customer = _customer(f"hal{tag}")
    lease = running_lease(customer)
    incident = node_down(lease)
    page = new_context(viewport=viewport).new_page()
    login(page, f"hal{tag}")
    page.goto(f"/leases/{lease.pk}/")
    assert page.locator("#incident-banner").is_visible()
    assert page.get_by_text("Your instance is down").is_visible()
    if tag == "phone":
        page.locator("details.nav-menu summary").click()
        assert page.locator(".nav-menu-body .notice-count").inner_text() == "1"
    else:
        assert page.locator(".nav-wide .notice-count").inner_text() == "1"
    assert no_horizontal_overflow(page)
    screenshot(page, f"lease-incident-{tag}")

    incident_migrate(incident=incident)  # the operator moves it; the page is still open
    page.locator("#migration-note").wait_for(timeout=ms(15))
    assert page.locator("#incident-banner").count() == 0
    assert page.get_by_text("Your instance is running.").is_visible()
    assert Notification.objects.filter(lease=lease, kind="migrated").exists()
    screenshot(page, f"lease-migrated-{tag}")


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_renewal_call_to_action_refund_limit_and_token_box(new_context, shop, settings, viewport, tag):
    from billing.refunds import lease_refund

    settings.HOST_AGENT_FAKE_DELAY = 0
    customer = _customer(f"ivy{tag}")
    from rental.services import customer_settings_update

    lease_refund(lease=running_lease(customer), actor=customer)  # this month's refund, used
    customer_settings_update(user=customer, email="", auto_renew=False)  # the refund is on the balance: not spent
    lease = running_lease(customer)
    invoice = renewal_due(lease)
    page = new_context(viewport=viewport).new_page()
    login(page, f"ivy{tag}")
    page.goto(f"/leases/{lease.pk}/")
    assert page.locator("#renewal-cta").is_visible()
    assert page.get_by_role("button", name="Cancel and refund…").count() == 0
    assert page.locator("#refund-used").is_visible()
    assert no_horizontal_overflow(page)
    screenshot(page, f"lease-renewal-{tag}")
    page.get_by_role("link", name=f"Renew: pay invoice #{invoice.pk}").click()
    page.wait_for_url(re.compile(rf"/billing/invoices/{invoice.pk}/$"))
    assert page.locator("#renewal-cta").is_visible()
    screenshot(page, f"invoice-renewal-{tag}")

    page.goto("/order/rtx-3090/")
    assert "no-questions refund of money this month" in page.locator("#refund-promise").inner_text()

    page.goto("/account/settings/")
    token_form = page.locator("form:has(button:has-text('Create token'))")
    token_form.locator("input[name=name]").fill("ci")
    token_form.get_by_role("button", name="Create token").click()
    page.locator("#new-token").wait_for()
    assert page.locator(".token-box button[data-copy]").is_visible()
    assert no_horizontal_overflow(page)  # a 605 px box once overflowed a 390 px screen
    screenshot(page, f"settings-token-{tag}")

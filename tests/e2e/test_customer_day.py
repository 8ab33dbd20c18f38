"""The customer's day in a real browser (Playwright + Debian chromium), at 1280 and 390
wide with screenshots: ordering while signed out ends on the order page after sign-up, the
demo store's simulated payment leads to a running lease with a copyable SSH line, a saved
key is preselected, the refund asks first, the catalog sorts and its filters fold away on
phones, the order total comes before the form on phones and its timeline fits its column."""
import re

import pytest
from django.utils import timezone

from tests.e2e.conftest import DESKTOP, PASSWORD, PHONE, screenshot
from tests.e2e.helpers import SSH_KEY, no_horizontal_overflow


@pytest.fixture
def demo_store(shop, settings):
    settings.DEMO_PAYMENTS = True
    return shop


@pytest.mark.parametrize("viewport,tag", [(DESKTOP, "desktop"), (PHONE, "phone")])
def test_signed_out_order_signup_demo_payment_and_a_running_lease(new_context, demo_store, viewport, tag):
    from ops.lifecycle import run_lifecycle
    from rental.models import Lease, LeaseState

    page = new_context(viewport=viewport).new_page()
    page.goto("/order/rtx-3090/")
    page.wait_for_url(re.compile(r"/accounts/login/\?next="))
    page.locator("main").get_by_role("link", name="Sign up").click()
    page.fill("#id_username", f"erin{tag}")
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.locator("main form button[type=submit]").click()
    page.get_by_role("link", name="I have saved them — continue").click()  # recovery codes first
    page.wait_for_url(re.compile(r"/order/rtx-3090/$"))  # back where the customer started

    total, form = page.locator("#order-summary"), page.locator("form.order-form")
    if tag == "phone":
        assert total.bounding_box()["y"] < form.bounding_box()["y"]  # the total before the long form
    else:
        svg = page.locator("#order-when .timeline-svg:visible").bounding_box()
        column = page.locator(".order-side").bounding_box()
        assert svg["x"] + svg["width"] <= column["x"] + column["width"] + 1  # the timeline fits its column
    assert no_horizontal_overflow(page)
    screenshot(page, f"order-{tag}")

    page.fill("#id_ssh_public_key", SSH_KEY)
    page.get_by_role("button", name="Place order").click()
    page.wait_for_url(re.compile(r"/leases/\d+/$"))
    lease = Lease.objects.get(customer__username=f"erin{tag}")
    page.get_by_role("link", name=re.compile(r"Pay invoice #\d+")).click()
    assert page.get_by_text("Demo store: payments are simulated").is_visible()
    screenshot(page, f"invoice-demo-{tag}")
    page.get_by_role("button", name="Simulate payment (demo)").click()
    page.get_by_text("marked paid without money").wait_for()

    run_lifecycle(timezone.now())
    page.goto(f"/leases/{lease.pk}/")
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE
    assert page.locator("#ssh-line").input_value() == lease.ssh_command
    copy = page.locator("button[data-copy]")
    assert copy.is_visible() and copy.get_attribute("data-copy") == lease.ssh_command
    assert page.get_by_text("Instance ready for SSH").first.is_visible()  # the event log in words
    assert no_horizontal_overflow(page)
    screenshot(page, f"lease-active-{tag}")


def test_saved_key_is_preselected_and_the_refund_asks_first(new_context, demo_store):
    from billing.models import Invoice
    from rental.models import Lease, LeaseState
    from rental.services import account_create
    from tests.e2e.conftest import login

    account_create(username="fred", password=PASSWORD)
    page = new_context().new_page()
    login(page, "fred")
    page.goto("/account/settings/")
    page.fill("#id_name", "laptop")
    page.fill("#id_public_key", SSH_KEY)
    page.get_by_role("button", name="Save key").click()
    page.get_by_text("SSH key “laptop” saved.").wait_for()
    screenshot(page, "settings-ssh-keys-desktop")

    page.goto("/order/rtx-3090/")
    assert page.locator("#id_saved_key option:checked").inner_text().startswith("laptop")
    page.get_by_role("button", name="Place order").click()
    page.wait_for_url(re.compile(r"/leases/\d+/$"))
    lease = Lease.objects.get(customer__username="fred")
    assert lease.ssh_public_key == SSH_KEY
    invoice = Invoice.objects.get(lease=lease)
    page.goto(f"/billing/invoices/{invoice.pk}/")
    page.get_by_role("button", name="Simulate payment (demo)").click()
    page.goto(f"/leases/{lease.pk}/")

    page.get_by_role("button", name="Cancel and refund…").click()
    page.wait_for_url(re.compile(r"/refund/\??$"))
    lease.refresh_from_db()
    assert lease.state != LeaseState.CANCELLED  # asking is not doing
    screenshot(page, "refund-confirm-desktop")
    page.get_by_role("button", name="Yes, cancel and refund").click()
    page.wait_for_url(re.compile(rf"/leases/{lease.pk}/$"))
    lease.refresh_from_db()
    assert lease.state == LeaseState.CANCELLED
    page.goto("/billing/")
    assert page.locator("main").get_by_text("refunded").first.is_visible()


def test_catalog_sorts_and_folds_its_filters_on_phones(new_context):
    page = new_context().new_page()
    page.goto("/gpus/")
    page.locator("#catalog-table").get_by_role("link", name=re.compile(r"^Month")).first.click()
    page.wait_for_url(re.compile(r"sort=price"))
    months = [int(t.replace("$", "").replace(",", "")) for t in
              page.locator("#catalog-table table").first.locator("td[data-label=Month]").all_inner_texts()]
    assert months == sorted(months)
    assert page.locator("details.filter-box form").is_visible()  # open on a desktop
    assert no_horizontal_overflow(page)
    assert page.locator("footer").get_by_role("link", name="Status").is_visible()
    screenshot(page, "catalog-sorted-desktop")

    phone = new_context(viewport=PHONE).new_page()
    phone.goto("/gpus/")
    assert not phone.locator("details.filter-box form").is_visible()  # folded: results first
    phone.locator("details.filter-box summary").click()
    assert phone.locator("#id_sort").is_visible()  # phones sort from the filter box
    assert no_horizontal_overflow(phone)
    screenshot(phone, "catalog-phone")

    phone.goto("/status/")
    assert phone.get_by_text("operational").first.is_visible() and no_horizontal_overflow(phone)
    screenshot(phone, "status-phone")

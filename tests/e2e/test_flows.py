"""The storefront in a real browser: a new customer sizes a 13B LoRA, orders the
recommended card, gets a crypto quote with its QR code, an operator settles the invoice in
the admin, the lease turns active with its SSH line; the catalog filters swap the table
without a reload; the calculator works without JavaScript."""
import re

import pytest
from django.utils import timezone

from tests.e2e.conftest import PASSWORD, PHONE, ms, screenshot
from tests.e2e.helpers import SSH_KEY
from tests.otp import code_for


@pytest.fixture
def coins(transactional_db):
    """LTC and USDT accepted (watch-only keys from the BIP84/BIP44 test mnemonic, no node):
    the override is module-global, so the live server's thread sees it too."""
    from tests.billing.payments_helpers import offline_coins, set_rate

    with offline_coins():
        set_rate("LTC", "100", timezone.now())
        set_rate("USDT", "1", timezone.now())
        yield


@pytest.fixture
def operator(transactional_db, django_user_model):
    """Staff must use two-factor sign-in: the operator has an authenticator (tests/otp.py)."""
    from tests.otp import authenticator_for

    user = django_user_model.objects.create_superuser(username="op", password="operator pass 12345")
    user.authenticator = authenticator_for(user)
    return user


def test_signup_size_order_pay_settle_and_the_lease_turns_active(new_context, coins, operator):
    from billing.models import Invoice
    from ops.lifecycle import run_lifecycle
    from rental.models import Lease

    page = new_context().new_page()

    # Sign up.
    page.goto("/accounts/signup/")
    page.fill("#id_username", "carol")
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.locator("main form button[type=submit]").click()
    # The recovery codes are shown once, then on to the home page.
    assert page.locator("ul.recovery-codes li").count() == 10
    page.get_by_role("link", name="I have saved them — continue").click()
    page.wait_for_url(re.compile(r"/$"))
    assert page.locator(".nav-wide").get_by_text("carol").is_visible()

    # Size a 13B LoRA; htmx fills the results.
    page.locator(".nav-wide").get_by_role("link", name="Size your job").click()
    page.select_option("#id_model", "llama-2-13b")
    page.select_option("#id_method", "lora")
    best = page.locator("#sizing-results tr.best")
    best.wait_for()
    page.wait_for_url(re.compile(r"model=llama-2-13b.*method=lora|method=lora.*model=llama-2-13b"))
    assert "llama-2-13b" in page.locator("#sizing-results h2").first.inner_text()
    assert page.locator("#sizing-results .membar svg:visible").count() == 1  # of its wide and narrow drawings
    offer_name = best.locator("th").first.inner_text().splitlines()[0].strip()

    # Order the recommended card.
    best.get_by_role("link", name="Order this").click()
    page.wait_for_url(re.compile(r"/order/"))
    assert offer_name in page.locator("h1").inner_text()
    page.fill("#id_ssh_public_key", SSH_KEY)
    page.get_by_role("button", name="Place order").click()
    page.wait_for_url(re.compile(r"/leases/\d+/$"))
    lease = Lease.objects.get(customer__username="carol")
    assert page.get_by_text("Waiting for payment").is_visible()
    assert page.locator(".steps li.current").inner_text().strip() == "Paid"

    # The invoice, awaiting payment; pay in LTC: the quote has its QR code and live status.
    invoice = Invoice.objects.get(lease=lease)
    page.get_by_role("link", name=f"Pay invoice #{invoice.pk}").click()
    page.wait_for_url(f"**/billing/invoices/{invoice.pk}/")
    assert page.get_by_text("Awaiting payment").is_visible()
    assert page.locator("h1 .badge").inner_text().strip() == "open"
    page.locator("main").get_by_role("link", name=re.compile(r"^Pay with")).click()
    page.wait_for_url(f"**/pay/invoice/{invoice.pk}/")
    page.get_by_label(re.compile(r"\(LTC\)")).check()
    page.get_by_role("button", name="Get the payment address").click()
    page.wait_for_url(re.compile(r"/pay/quote/\d+/$"))
    qr = page.locator("figure.qr svg")
    assert qr.count() == 1 and qr.bounding_box()["width"] >= 150
    assert page.locator("#quote-address").inner_text().startswith("rltc1")
    status = page.locator("#quote-status")
    assert "Waiting for your payment" in status.inner_text()
    assert status.get_attribute("hx-trigger") == "every 5s"  # live: htmx polls it
    screenshot(page, "quote-desktop")

    # An operator settles the invoice manually in the admin, with a note.
    admin = new_context().new_page()
    admin.goto("/admin/login/")
    admin.fill("#id_username", "op")
    admin.fill("#id_password", "operator pass 12345")
    admin.locator("input[type=submit]").click()
    # The code step: the operator types the code their authenticator app shows.
    admin.wait_for_url(re.compile(r"/accounts/otp/verify/"))
    admin.fill("#id_code", code_for(operator.authenticator))
    admin.locator("main form button[type=submit]").click()
    admin.wait_for_url(re.compile(r"/admin/$"))
    admin.goto(f"/admin/billing/invoice/?q={invoice.pk}")
    admin.locator(f"input[name=_selected_action][value='{invoice.pk}']").check()
    admin.select_option("select[name=action]", "settle_manually")
    admin.locator("button[name=index], input[name=index]").first.click()
    admin.fill("textarea[name=note]", "Paid by bank transfer, ref E2E-1")
    admin.get_by_role("button", name="Yes, mark paid").click()
    admin.get_by_text(f"Settled: #{invoice.pk}").wait_for()
    invoice.refresh_from_db()
    assert invoice.state == Invoice.State.PAID and invoice.note.startswith("Paid by bank transfer")

    # The customer's lease page is polling; one lifecycle pass provisions the instance.
    page.goto(f"/leases/{lease.pk}/")
    assert page.locator(".steps li.current").inner_text().strip() == "Provisioning"
    assert page.locator("#lease-live").get_attribute("hx-trigger") == "every 3s"
    run_lifecycle(timezone.now())
    ssh = page.locator("#ssh-line")
    ssh.wait_for(timeout=ms(10))  # swapped in by the poll, no reload
    assert ssh.input_value() == f"ssh -p {22000 + lease.pk} root@lease-{lease.pk}.gpu.local"
    assert page.get_by_text("Your instance is running.").is_visible()
    assert page.locator("#lease-status").get_attribute("hx-trigger") is None  # polling stopped
    assert page.locator(".steps li.done").count() == 4


def test_catalog_filters_swap_the_table_without_a_reload(new_context):
    page = new_context().new_page()
    page.goto("/gpus/")
    rows = page.locator("#catalog-table tbody tr")
    before = rows.count()
    assert before > 5
    page.evaluate("window.__marker = 1")
    page.fill("#id_min_vram", "100")
    page.locator("#id_min_vram").dispatch_event("change")
    page.wait_for_url(re.compile(r"min_vram=100"))
    page.wait_for_function(f"document.querySelectorAll('#catalog-table tbody tr').length < {before}")
    assert page.evaluate("window.__marker") == 1  # same document: no reload
    for text in page.locator("#catalog-table tbody td[data-label=VRAM]").all_inner_texts():
        assert int(text.split()[0]) >= 100
    page.check("#id_in_stock")
    page.wait_for_url(re.compile(r"in_stock=on"))
    assert page.evaluate("window.__marker") == 1


def test_calculator_works_without_javascript(new_context):
    page = new_context(viewport=PHONE, java_script_enabled=False).new_page()
    page.goto("/size/")
    page.select_option("#id_model", "llama-2-13b")
    page.select_option("#id_method", "qlora")
    page.get_by_role("button", name="Size it").click()
    page.wait_for_url(re.compile(r"/size/\?.*model=llama-2-13b"))
    results = page.locator("#sizing-results")
    assert "llama-2-13b" in results.locator("h2").first.inner_text()
    assert results.locator("tr.best").get_by_role("link", name="Order this").is_visible()
    # The phone menu is a <details>: it opens without JavaScript too.
    menu = page.locator("details.nav-menu")
    assert not menu.get_by_role("link", name="FAQ").is_visible()
    menu.locator("summary").click()
    assert menu.get_by_role("link", name="FAQ").is_visible()

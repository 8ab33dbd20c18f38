"""A screenshot of each main page at desktop (1280×900) and phone (390×844) width, saved to
tests/e2e/screenshots/ (git-ignored) for people to look at; each page is also checked for
the mistakes a screenshot shows: a horizontal scrollbar on the phone, a server error."""
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.e2e.conftest import DESKTOP, PASSWORD, PHONE, login, screenshot


@pytest.fixture
def customer_with_leases(shop):
    """dana: an active lease (paid from balance, provisioned), a pending one with an open
    invoice and an LTC quote for it, some ledger entries."""
    from billing.payments.services import quote_create
    from billing.services import balance_top_up
    from ops.lifecycle import run_lifecycle
    from rental.services import account_create
    from tests.billing.payments_helpers import offline_coins, set_rate
    from tests.factories import order

    dana = account_create(username="dana", password=PASSWORD, email="dana@example.org")
    now = timezone.now()
    balance_top_up(customer=dana, amount_cents=50_000, now=now)
    active, _ = order(dana, now, pay=True)
    run_lifecycle(now + timedelta(seconds=1))
    pending, invoice = order(dana, now, offer="rtx-a5000", term="month", pay=False)
    with offline_coins():
        set_rate("LTC", "100", now)
        quote = quote_create(invoice=invoice, coin="LTC", now=now)
        yield {"active": active, "pending": pending, "invoice": invoice, "quote": quote}


PAGES = {  # name: path (callables get the fixture's objects)
    "home": "/",
    "catalog": "/gpus/",
    "gpu": "/gpus/h100-sxm/",
    "calculator": "/size/?model=llama-2-13b&method=lora",
    "tables": "/size/tables/",
    "faq": "/faq/",
    "order": "/order/rtx-3090/",
    "leases": "/leases/",
    "lease": lambda o: f"/leases/{o['active'].pk}/",
    "lease-pending": lambda o: f"/leases/{o['pending'].pk}/",
    "invoice": lambda o: f"/billing/invoices/{o['invoice'].pk}/",
    "pay": lambda o: f"/pay/invoice/{o['invoice'].pk}/",
    "quote": lambda o: f"/pay/quote/{o['quote'].pk}/",
    "balance": "/billing/balance/",
    "settings": "/account/settings/",
}


@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_screenshots_of_the_main_pages(new_context, customer_with_leases, width):
    viewport = DESKTOP if width == "desktop" else PHONE
    problems = []

    guest = new_context(viewport=viewport).new_page()
    guest.goto("/accounts/login/")
    screenshot(guest, f"login-{width}")
    page = new_context(viewport=viewport).new_page()
    login(page, "dana")
    for name, path in PAGES.items():
        url = path(customer_with_leases) if callable(path) else path
        response = page.goto(url)
        if response.status != 200:
            problems.append(f"{name}: HTTP {response.status}")
        screenshot(page, f"{name}-{width}")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        if overflow > 1:
            problems.append(f"{name}: {overflow}px wider than the {width} viewport")
    assert not problems, problems

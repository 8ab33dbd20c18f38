"""Reloads, phones and small screens in a real browser, with screenshots: reloading the page after sign-up
or after making an API token re-sends no form and shows the secret no more; chart labels are
readable at 390 px; on a phone the order form comes before the timeline; a key pasted at
ordering can be saved to the account; the link filter names only cards that are sold; the
operator's lease change page fits 1366 px."""
import re

import pytest

from tests.e2e.conftest import DESKTOP, PASSWORD, PHONE, login, screenshot
from tests.e2e.helpers import _customer, no_horizontal_overflow

VIEWPORTS = [(DESKTOP, "desktop"), (PHONE, "phone")]


def _posts_to(page, path: str) -> list:
    """Every POST the page sends to `path` from now on (a reload's re-sent form would be one)."""
    sent = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" and r.url.endswith(path) else None)
    return sent


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_reloading_after_sign_up_sends_nothing_and_shows_the_codes_no_more(new_context, shop, viewport, tag):
    from django.contrib.auth.models import User

    from rental.models import RecoveryCode

    page = new_context(viewport=viewport).new_page()
    page.goto("/accounts/signup/")
    page.fill("#id_username", f"jo{tag}")
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    posts = _posts_to(page, "/accounts/signup/")
    page.locator("main form button[type=submit]").click()
    page.wait_for_url(re.compile(r"/accounts/recovery-codes/new/"))
    codes = page.locator("ul.recovery-codes li").all_inner_texts()
    assert len(codes) == 10 and len(posts) == 1  # shown on the first display, after the redirect
    screenshot(page, f"signup-codes-{tag}")

    page.reload()
    assert len(posts) == 1  # the reload is a GET: no second sign-up
    assert page.locator("ul.recovery-codes").count() == 0 and page.locator("#codes-shown-once").is_visible()
    assert not any(code in page.content() for code in codes)
    assert User.objects.filter(username=f"jo{tag}").count() == 1
    assert RecoveryCode.objects.filter(user__username=f"jo{tag}", used_at__isnull=True).count() == 10  # still valid
    assert no_horizontal_overflow(page)
    screenshot(page, f"signup-codes-reloaded-{tag}")
    page.get_by_role("link", name="Continue").click()
    page.wait_for_url(re.compile(r"/$"))


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_reloading_after_a_new_token_sends_nothing_and_shows_it_no_more(new_context, shop, viewport, tag):
    from rental.accounts.services import api_token_authenticate
    from rental.models import ApiToken

    _customer(f"kim{tag}")
    page = new_context(viewport=viewport).new_page()
    login(page, f"kim{tag}")
    page.goto("/account/settings/")
    posts = _posts_to(page, "/account/tokens/")
    token_form = page.locator("form:has(button:has-text('Create token'))")
    token_form.locator("input[name=name]").fill("laptop")
    token_form.get_by_role("button", name="Create token").click()
    page.wait_for_url(re.compile(r"/account/settings/#tokens$"))
    raw = page.locator("#new-token").input_value()
    assert raw.startswith("gpr_") and api_token_authenticate(raw).name == "laptop"
    assert page.locator(".token-box button[data-copy]").is_visible() and no_horizontal_overflow(page)
    screenshot(page, f"token-new-{tag}")

    page.reload()
    assert len(posts) == 1 and ApiToken.objects.filter(customer__username=f"kim{tag}").count() == 1
    assert page.locator("#new-token").count() == 0 and raw not in page.content()
    assert page.locator("#tokens").get_by_text("laptop").is_visible()  # the token is listed, its secret not
    screenshot(page, f"token-reloaded-{tag}")


SMALLEST_LABEL_JS = """() => {
  const shown = [...document.querySelectorAll('main svg text')].filter(t => t.getBoundingClientRect().width > 0);
  return shown.map(t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
}"""


def _label_sizes(page) -> list[float]:
    """The rendered size (px) of every visible chart label: its font size times the drawing's scale."""
    return page.evaluate(SMALLEST_LABEL_JS)


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_chart_labels_are_readable(new_context, shop, viewport, tag):
    from tests.experience.scenes import running_lease

    lease = running_lease(_customer(f"lou{tag}"))
    page = new_context(viewport=viewport).new_page()
    login(page, f"lou{tag}")
    pages = {"home": "/", "gpu": "/gpus/rtx-3090/", "sizing": "/size/?model=llama-2-13b&method=lora",
             "order": "/order/rtx-3090/", "lease": f"/leases/{lease.pk}/"}
    for name, url in pages.items():
        page.goto(url)
        sizes = _label_sizes(page)
        assert sizes and min(sizes) >= 11, (name, sorted(sizes)[:3])  # the issue measured 4-6 px at 390
        assert no_horizontal_overflow(page), name
        if name in ("sizing", "lease"):
            screenshot(page, f"chart-labels-{name}-{tag}")


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_order_page_puts_the_form_before_the_timeline_on_phones(new_context, shop, viewport, tag):
    _customer(f"max{tag}")
    page = new_context(viewport=viewport).new_page()
    login(page, f"max{tag}")
    page.goto("/order/rtx-3090/")
    total, form = page.locator("#order-summary").bounding_box(), page.locator("form.order-form").bounding_box()
    when = page.locator("#order-when").bounding_box()
    if tag == "phone":
        # The total first (what "Place order" charges), then the form, then the 9 steps.
        assert total["y"] < form["y"] and form["y"] + form["height"] <= when["y"]
    else:
        assert when["x"] >= form["x"] + form["width"] and total["y"] < when["y"]  # both beside the form
    assert page.locator("#order-when .tl-list li").count() == 9
    last_step = page.locator("#order-when .tl-list li").last.inner_text()
    page.get_by_label("1 week (7 days)").check()  # htmx swaps the total and, out of band, the timeline
    page.wait_for_function("t => document.querySelector('#order-when .tl-list li:last-child').innerText !== t",
                           arg=last_step)
    assert "week" in page.locator("#order-summary").inner_text()
    assert no_horizontal_overflow(page)
    screenshot(page, f"order-form-first-{tag}")


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_a_key_pasted_at_ordering_can_be_saved_for_the_next_order(new_context, shop, viewport, tag):
    from rental.models import SshKey
    from tests.e2e.helpers import SSH_KEY

    _customer(f"nia{tag}")
    page = new_context(viewport=viewport).new_page()
    login(page, f"nia{tag}")
    page.goto("/order/rtx-3090/")
    save = page.get_by_label("Save this key to my account for later orders")
    assert save.is_visible() and not save.is_checked()  # offered, off unless ticked
    page.fill("#id_ssh_public_key", SSH_KEY)
    save.check()
    assert no_horizontal_overflow(page)
    screenshot(page, f"order-save-key-{tag}")
    page.get_by_role("button", name="Place order").click()
    page.wait_for_url(re.compile(r"/leases/\d+/$"))
    assert page.get_by_text("SSH key “carol@laptop” saved to your account for later orders.").is_visible()
    key = SshKey.objects.get(customer__username=f"nia{tag}")
    assert key.public_key == SSH_KEY

    page.goto("/order/a40/")  # the next order offers it, chosen already
    assert page.locator("#id_saved_key").input_value() == str(key.pk)
    assert page.locator("#id_saved_key option:checked").inner_text().startswith("carol@laptop")


@pytest.mark.parametrize("viewport,tag", VIEWPORTS)
def test_the_link_filter_names_only_cards_on_sale(new_context, shop, viewport, tag):
    from inventory.models import GpuModel

    sold = set(GpuModel.objects.filter(offers__is_active=True).values_list("name", flat=True))
    page = new_context(viewport=viewport).new_page()
    page.goto("/gpus/")
    if tag == "phone" and not page.locator("#id_link").is_visible():
        page.locator("details.filter-box summary").click()
    options = page.locator("#id_link option").all_inner_texts()[1:]  # after "Any"
    named = {card for label in options for card in label.split(" — ", 1)[1].split(", ")}
    assert named == sold and "L4" not in named and "RTX 6000 Ada" not in named
    page.select_option("#id_link", label="PCIe Gen4 peer-to-peer — L40S")
    page.wait_for_url(re.compile(r"link=pcie-p2p"))
    rows = page.locator("#catalog-table tbody tr")
    rows.first.wait_for()
    assert all("L40S" in text for text in rows.all_inner_texts())
    assert no_horizontal_overflow(page)
    screenshot(page, f"catalog-link-filter-{tag}")


OVERFLOW_JS = """() => [...document.querySelectorAll('#content *')]
  .filter(e => e.getBoundingClientRect().right > innerWidth + 1 || e.scrollWidth > e.clientWidth + 1)
  .map(e => e.tagName + (e.id ? '#' + e.id : '') + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"""


def _rsa_4096_key() -> str:
    """A customer's RSA 4096 public key: one unbroken 716-character word on the page."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=4096).public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + " ola@ws"


def test_the_lease_admin_change_page_fits_1366_px(new_context, shop, operator):
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from rental.models import Lease
    from tests.experience.scenes import running_lease
    from tests.otp import code_for

    lease = running_lease(_customer("ola"), slug="8x-h100-sxm")  # eight GPU slots, a long event payload
    Lease.objects.filter(pk=lease.pk).update(ssh_public_key=_rsa_4096_key())
    page = new_context(viewport={"width": 1366, "height": 768}).new_page()
    page.goto("/admin/login/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "operator pass 12345")
    page.locator("input[type=submit]").click()
    page.wait_for_url(re.compile(r"/accounts/otp/verify/"))
    page.fill("#id_code", code_for(TOTPDevice.objects.get(user=operator)))
    page.locator("main form button[type=submit]").click()
    page.goto(f"/admin/rental/lease/{lease.pk}/change/")
    screenshot(page, "admin-lease-change-1366")
    assert no_horizontal_overflow(page), page.evaluate(OVERFLOW_JS)
    assert page.evaluate(OVERFLOW_JS) == []  # nor a box scrolling sideways inside it

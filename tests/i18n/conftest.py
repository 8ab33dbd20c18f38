import html
import re

import pytest
from django.utils import timezone, translation

from billing.models import Invoice
from billing.payments.services import quote_create
from billing.services import balance_top_up
from tests.billing.payments_helpers import offline_coins, set_rate
from tests.factories import order
from tests.i18n.catalog import CJK, english_ui_strings

ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-Hans,zh;q=0.9,en;q=0.5"}
EN = {"HTTP_ACCEPT_LANGUAGE": "en-US,en;q=0.9"}


def visible(response) -> str:
    """The page as a reader (and a screen reader) gets it: markup kept, entities decoded."""
    return html.unescape(response.content.decode())


def assert_chinese(response, url=""):
    text = visible(response)
    assert '<html lang="zh-hans">' in text, url
    assert len(CJK.findall(re.sub(r"<[^>]+>", " ", text))) >= 10, f"{url}: hardly any Chinese"
    left = [s for s in english_ui_strings() if s in text]
    assert not left, f"{url}: English UI strings left on the Chinese page: {left}"


@pytest.fixture(autouse=True)
def _english_default(settings):
    settings.LANGUAGE_CODE = "en"


@pytest.fixture
def shop(catalog, customer, client):
    """A pending order with an open invoice, an active lease, a quote, some balance; created
    in Chinese, as a customer browsing in Chinese would (invoice lines are stored text)."""
    now = timezone.now()
    with offline_coins(), translation.override("zh-hans"):
        balance_top_up(customer=customer, amount_cents=500_000, now=now)
        active, _ = order(customer, now, pay=True)
        pending, invoice = order(customer, now, pay=False, offer="rtx-a6000")
        set_rate("LTC", "100", now)
        quote = quote_create(invoice=invoice, coin="LTC", now=now)
        client.force_login(customer)
        yield {"lease": active, "pending": pending, "invoice": invoice, "quote": quote,
               "paid_invoice": Invoice.objects.filter(lease=active).first()}

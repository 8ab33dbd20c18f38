"""Shared by the security tests: one customer's things, for another to reach for."""
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.payments.services import quote_create
from rental.accounts.services import api_token_create
from rental.models import Notification
from rental.services import notify
from tests.billing.payments_helpers import offline_coins, set_rate
from tests.factories import place


@pytest.fixture
def alices(catalog, customer):
    """Alice's lease (pending, with its open invoice), a quote to pay it, a token, a notice."""
    with offline_coins():
        lease, invoice = place(customer)
        set_rate("LTC", "100", timezone.now())
        quote = quote_create(invoice=invoice, coin="LTC", now=timezone.now())
        token, _raw = api_token_create(customer=customer, name="laptop")
        notify(lease=lease, kind="test", deadline=timezone.now() + timedelta(days=1), subject="s", body="b")
        yield {"lease": lease, "invoice": invoice, "quote": quote, "token": token,
               "notification": Notification.objects.get(customer=customer)}



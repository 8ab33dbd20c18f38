"""Refund abuse: the spec's 1-hour no-questions refund still returns
everything, but a customer gets REFUNDS_PER_MONTH of them per calendar month (default 1),
each is audited (with the minutes the instance ran), and the lease page says how many are
left before the customer asks. Cancelling an unpaid order and operators' refunds do not
count."""
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Account, LedgerEntry
from billing.refunds import lease_refund, refunds_left
from billing.services import RefundLimitReached, balance_top_up
from inventory.models import AuditEntry
from rental.accounts.services import api_token_create
from rental.models import LeaseState
from tests.factories import place

pytestmark = pytest.mark.django_db


@pytest.fixture
def funded(catalog, customer):
    balance_top_up(customer=customer, amount_cents=1_000_00, now=timezone.now())
    return customer


def test_one_refund_of_money_a_month_then_refused(funded, settings):
    assert settings.REFUNDS_PER_MONTH == 1  # the shipped default
    first, _ = place(funded, pay=True)
    assert lease_refund(lease=first, actor=funded) == 6500
    second, _ = place(funded, pay=True)
    balance = Account.objects.get(customer=funded).balance_cents
    with pytest.raises(RefundLimitReached):
        lease_refund(lease=second, actor=funded)
    second.refresh_from_db()
    assert second.state != LeaseState.CANCELLED
    assert Account.objects.get(customer=funded).balance_cents == balance
    audit = AuditEntry.objects.get(action="lease_refund", object_id=str(first.pk))
    assert audit.detail["amount_cents"] == 6500 and audit.detail["by_customer"] is True
    assert "used_minutes" in audit.detail


def test_the_allowance_comes_back_next_month(funded):
    june = datetime(2031, 6, 30, 23, 30, tzinfo=UTC)
    first, _ = place(funded, pay=True)
    second, _ = place(funded, pay=True)
    type(first).objects.filter(pk__in=[first.pk, second.pk]).update(created_at=june)
    lease_refund(lease=first, actor=funded, now=june + timedelta(minutes=10))
    assert refunds_left(funded, june + timedelta(minutes=20)) == 0
    with pytest.raises(RefundLimitReached):
        lease_refund(lease=second, actor=funded, now=june + timedelta(minutes=20))
    july = june + timedelta(minutes=40)  # 2031-07-01 00:10, still within the hour
    assert refunds_left(funded, july) == 1
    assert lease_refund(lease=second, actor=funded, now=july) == 6500


def test_cancelling_unpaid_orders_and_operator_refunds_do_not_count(funded, operator):
    for _ in range(3):
        unpaid, _ = place(funded)
        assert lease_refund(lease=unpaid, actor=funded) == 0
    paid, _ = place(funded, pay=True)
    assert lease_refund(lease=paid, actor=operator) == 6500
    assert refunds_left(funded) == 1
    mine, _ = place(funded, pay=True)
    assert lease_refund(lease=mine, actor=funded) == 6500
    assert LedgerEntry.objects.filter(kind="refund").count() == 2


def test_the_lease_page_shows_the_allowance_and_the_api_refuses_over_it(client, funded):
    client.force_login(funded)
    first, _ = place(funded, pay=True)
    page = client.get(reverse("lease_detail", args=[first.pk])).content.decode()
    assert "Refunds of money: 1 of 1 left this month" in page
    client.post(reverse("billing:lease_refund", args=[first.pk]))
    second, _ = place(funded, pay=True)
    page = client.get(reverse("lease_detail", args=[second.pk])).content.decode()
    # None left: no refund button, a sentence that says why; a forged POST is refused.
    assert "no-questions refund of money this month" in page and "Cancel and refund…" not in page
    response = client.post(reverse("billing:lease_refund", args=[second.pk]), follow=True)
    assert "no-questions refund" in response.content.decode()

    raw = api_token_create(customer=funded, name="bot")[1]
    response = client.post(reverse("api_lease_refund", args=[second.pk]), data=json.dumps({}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 409 and response.json()["error"] == "refund_limit_reached"

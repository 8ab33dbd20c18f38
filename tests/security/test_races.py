"""The hoarding and refund limits under races on PostgreSQL (real threads, each on its own
connection): a hoarder firing orders at once still gets at most MAX_OPEN_UNPAID_ORDERS,
and two refunds at once still count as two against REFUNDS_PER_MONTH."""
import pytest
from django.utils import timezone

from billing.refunds import lease_refund
from billing.services import BillingError, RefundLimitReached, TooManyOpenOrders, balance_top_up
from rental.models import Lease, LeaseState
from tests.billing.races import in_threads, postgres_only
from tests.factories import new_customer, place

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


def test_concurrent_orders_cannot_pass_the_unpaid_order_limit(catalog, settings):
    settings.MAX_OPEN_UNPAID_ORDERS = 2
    hoarder = new_customer("hoarder")
    results = in_threads(*[lambda: place(hoarder) for _ in range(6)])
    placed = [r for r in results if isinstance(r, tuple)]
    refused = [r for r in results if isinstance(r, TooManyOpenOrders)]
    assert len(placed) == 2 and len(refused) == 4, results
    assert Lease.objects.filter(customer=hoarder, state=LeaseState.PENDING).count() == 2


def test_concurrent_refunds_count_one_after_the_other(catalog, settings):
    settings.REFUNDS_PER_MONTH = 1
    customer = new_customer("refunder")
    balance_top_up(customer=customer, amount_cents=1_000_00, now=timezone.now())
    leases = [place(customer, pay=True)[0] for _ in range(3)]
    results = in_threads(*[lambda lease=lease: lease_refund(lease=lease, actor=customer) for lease in leases])
    assert sorted(type(r).__name__ for r in results) == ["RefundLimitReached", "RefundLimitReached", "int"], results
    assert [r for r in results if not isinstance(r, BillingError)] == [6500]
    assert all(isinstance(r, (int, RefundLimitReached)) for r in results)
    assert Lease.objects.filter(customer=customer, state=LeaseState.CANCELLED).count() == 1


# --- One code, many sessions at once ---------------------------------------------------

def test_one_totp_code_sent_by_six_sessions_at_once_lets_one_in(customer):
    from rental.accounts.two_factor import matching_device
    from tests.otp import authenticator_for, code_for

    device = authenticator_for(customer)
    code = code_for(device)
    results = in_threads(*[lambda: matching_device(customer, code) for _ in range(6)])
    assert sum(r is not None and not isinstance(r, BaseException) for r in results) == 1, results


def test_one_recovery_code_sent_by_six_sessions_at_once_lets_one_in(customer):
    from rental.accounts.two_factor import matching_device, recovery_codes_issue

    code = recovery_codes_issue(user=customer)[0]
    results = in_threads(*[lambda: matching_device(customer, code) for _ in range(6)])
    assert sum(r is not None and not isinstance(r, BaseException) for r in results) == 1, results


def test_concurrent_sign_ups_from_one_address_cannot_pass_its_limit(settings):
    from django.contrib.auth.models import User
    from django.core.cache import cache
    from django.test import Client

    settings.SIGNUPS_PER_IP = 5
    cache.clear()

    def sign_up(n):
        return Client(REMOTE_ADDR="198.51.100.9").post("/accounts/signup/", {
            "username": f"sock{n}", "password1": "correct horse battery 9",
            "password2": "correct horse battery 9"}).status_code

    results = in_threads(*[lambda n=n: sign_up(n) for n in range(8)])
    assert sorted(results) == [302] * 5 + [429] * 3, results  # 302: made, on to its recovery codes
    assert User.objects.filter(username__startswith="sock").count() == 5
    cache.clear()


# --- unpaid holds against a SKU's reserve, at once from many networks -------------------------

def test_concurrent_unpaid_orders_from_many_networks_leave_the_reserve(catalog, settings):
    from billing.holds import UnpaidHoldRefused
    from inventory.selectors import free_slots_queryset
    from tests.security.helpers import order

    settings.UNPAID_HOLD_MAX_SHARE_BPS, settings.UNPAID_HOLD_RESERVE_UNITS = 10_000, 2
    holders = [new_customer(f"net{i}") for i in range(8)]
    results = in_threads(*[lambda i=i: order(holders[i], address=f"198.51.{i}.10") for i in range(8)])
    placed = [r for r in results if isinstance(r, tuple)]
    refused = [r for r in results if isinstance(r, UnpaidHoldRefused)]
    assert len(placed) == 6 and len(refused) == 2, results
    assert free_slots_queryset().filter(node__gpu_model__slug="mi300x").count() == 2

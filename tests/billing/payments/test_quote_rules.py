"""The rules a quote is made by, as the customer meets them: what each refusal says, how
many new addresses an hour one customer may ask for, when the same quote is handed out
again, and how a quote moves its invoice's deadline."""
from datetime import timedelta

import pytest

from billing.models import Invoice, Quote
from billing.payments.health import coin_health_record
from billing.payments.pricing import PaymentError
from billing.payments.quotes import quote_create
from billing.payments.services import sweep_expire_quotes
from billing.services import topup_invoice_create
from tests.billing.payments_helpers import apply, fresh, paid, set_rate
from tests.factories import order


def refusal(invoice, coin, now):
    with pytest.raises(PaymentError) as refused:
        quote_create(invoice=invoice, coin=coin, now=now)
    return str(refused.value)


def test_each_refusal_says_what_is_wrong_and_what_to_do(catalog, customer, coins, t0):
    set_rate("LTC", "100", t0)
    _, invoice = order(customer, t0, pay=False)
    assert refusal(invoice, "doge", t0) == "Unknown coin 'doge'."
    assert refusal(invoice, "btc", t0) == "BTC is not accepted here."
    coin_health_record(coin="LTC", now=t0, error="litecoind refused the connection")
    assert refusal(invoice, "LTC", t0) == ("We cannot watch the LTC network right now, so we do not take LTC "
                                           "payments; please pay with another coin or try again later.")
    coin_health_record(coin="LTC", now=t0, tip_time=int(t0.timestamp()))
    Invoice.objects.filter(pk=invoice.pk).update(state=Invoice.State.VOID)
    assert refusal(invoice, "LTC", t0) == f"Invoice #{invoice.pk} is no longer open."


def test_a_new_address_counts_against_the_hourly_limit_for_one_hour(catalog, customer, coins, t0, settings):
    settings.QUOTES_PER_CUSTOMER_PER_HOUR = 1
    settings.MAX_OPEN_UNPAID_ORDERS = 3  # the first order, past its window, is not swept here
    set_rate("LTC", "100", t0)
    _, first = order(customer, t0, pay=False)
    quote_create(invoice=first, coin="LTC", now=t0)
    almost, hour = t0 + timedelta(minutes=59), t0 + timedelta(hours=1)
    set_rate("LTC", "100", almost)
    _, second = order(customer, almost, pay=False)
    assert refusal(second, "LTC", almost) == ("You asked for many payment addresses in the last hour; please pay one "
                                              "of your open quotes, or try again later.")
    set_rate("LTC", "100", hour)
    assert quote_create(invoice=second, coin="LTC", now=hour).created_at == hour


def test_a_quote_that_got_money_is_not_handed_out_again(catalog, customer, coins, t0):
    """Asking again for the same coin gives the same address while nothing was paid to it;
    once part of the amount arrived there, the customer gets a new address."""
    set_rate("LTC", "100", t0)
    _, invoice = order(customer, t0, pay=False)
    first = quote_create(invoice=invoice, coin="LTC", now=t0)
    assert quote_create(invoice=invoice, coin="LTC", now=t0 + timedelta(minutes=1)).pk == first.pk
    apply(first, [paid(first, int(first.amount) // 2, 0)], t0 + timedelta(minutes=1))
    assert fresh(first).state == Quote.State.PROCESSING
    second = quote_create(invoice=invoice, coin="LTC", now=t0 + timedelta(minutes=2))
    assert second.pk != first.pk and second.address != first.address


def test_an_expired_quote_is_replaced_at_the_current_rate(catalog, customer, coins, t0):
    """A renewal has no payment deadline of its own; its quote's does. Asked again after that,
    before the sweep marked the old quote expired, the customer gets a new quote at today's rate."""
    set_rate("LTC", "100", t0)
    _, invoice = order(customer, t0, pay=False)
    Invoice.objects.filter(pk=invoice.pk).update(kind=Invoice.Kind.RENEWAL, expires_at=None)
    old = quote_create(invoice=fresh(invoice), coin="LTC", now=t0)
    later = old.expires_at + timedelta(minutes=1)
    set_rate("LTC", "50", later)
    new = quote_create(invoice=invoice, coin="LTC", now=later)
    assert fresh(old).state == Quote.State.NEW
    assert new.pk != old.pk and int(new.amount) == 2 * int(old.amount)


def test_a_quote_in_another_coin_does_not_cut_short_the_hold_of_a_payment_confirming(placed, t0, settings):
    """The whole amount seen unconfirmed holds the order's slots for the monitoring window;
    the customer then opening the USDT quote too (30 minutes) leaves that hold as it was."""
    settings.PAYMENT_MONITORING_MINUTES = 360
    _, invoice, ltc = placed
    apply(ltc, [paid(ltc, int(ltc.amount), 0)], t0 + timedelta(minutes=5))
    held = fresh(invoice).expires_at
    assert held == t0 + timedelta(minutes=5, hours=6)
    quote_create(invoice=invoice, coin="USDT", now=t0 + timedelta(minutes=10))
    assert fresh(invoice).expires_at == held


def test_a_top_up_keeps_its_own_deadline_when_a_quote_is_taken_late(customer, coins, t0, settings):
    """A late quote still gets the minimum time to pay, but only an order's deadline (its
    slots) moves with it: the top-up takes no new quote after its own window."""
    settings.PAYMENT_QUOTE_MIN_MINUTES = 10
    topup = topup_invoice_create(customer=customer, amount_cents=5000, now=t0)
    late = t0 + timedelta(minutes=28)
    set_rate("LTC", "100", late)
    assert quote_create(invoice=topup, coin="LTC", now=late).expires_at == t0 + timedelta(minutes=38)
    assert fresh(topup).expires_at == t0 + timedelta(minutes=30)
    assert refusal(topup, "USDT", t0 + timedelta(minutes=31)) == f"Invoice #{topup.pk} is no longer open."


def test_a_quote_taken_late_keeps_the_order_open_to_its_own_deadline(placed, t0, settings):
    """A quote opened near the end of the order's window gets the minimum time to pay, and
    the order's slots are held that long: another quote of the order expiring unpaid
    meanwhile does not take that time back, so the late payment still pays the order."""
    settings.PAYMENT_QUOTE_MIN_MINUTES = 10
    _, invoice, ltc = placed
    late = t0 + timedelta(minutes=28)
    set_rate("USDT", "1", late)
    usdt = quote_create(invoice=invoice, coin="USDT", now=late)
    assert usdt.expires_at == fresh(invoice).expires_at == t0 + timedelta(minutes=38)
    sweep_expire_quotes(t0 + timedelta(minutes=31))
    assert fresh(ltc).state == Quote.State.EXPIRED
    assert fresh(invoice).expires_at == t0 + timedelta(minutes=38)
    apply(usdt, [paid(usdt, int(usdt.amount), 100)], t0 + timedelta(minutes=35))   # confirmed
    assert fresh(usdt).state == Quote.State.SETTLED
    assert fresh(invoice).state == Invoice.State.PAID

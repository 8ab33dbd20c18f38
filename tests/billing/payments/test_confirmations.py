"""Confirmation counts by behaviour: for every coin, a payment one confirmation short of
what the coin requires is seen but not credited (the invoice stays open, the lease
unpaid); the same payment at the required count pays the invoice and starts the lease.

The counts are pinned here, not read from the code under test (halving one went
unnoticed): Bitcoin 2, Litecoin 6 (cheap blocks, deeper), Ethereum and its tokens 12,
Monero 10 (its outputs unlock after 10 blocks), Solana 1 (= finalized). SPEC.md carries no
table of them; these are the defaults the operator's `<COIN>_CONFIRMATIONS` settings override."""
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import Invoice, Payment, Quote
from billing.payments.coins.base import Coin
from billing.services import checkout_place_order
from inventory.models import Offer, Site
from rental.models import Image, LeaseState
from tests.billing.payments_helpers import apply, fresh, paid, txid

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"


def quote_for(invoice, coin: Coin, now) -> Quote:
    """A quote as quote_create leaves it (built directly: most coins have no adapter here,
    and the count required then comes from the coin's own rules, as in production)."""
    address = f"{coin.value.lower()}-address-{invoice.pk}"
    return Quote.objects.create(
        invoice=invoice, coin=coin, address=address, reference=address if coin is Coin.SOL else "", amount=10_000,
        usd_cents=invoice.amount_cents, rate_usd_per_coin=Decimal("100"), rate_source="operator", rate_at=now,
        uri=f"{coin.value.lower()}:{address}", created_at=now, expires_at=now + timedelta(minutes=30))


REQUIRED = {Coin.BTC: 2, Coin.LTC: 6, Coin.ETH: 12, Coin.USDT: 12, Coin.USDC: 12, Coin.XMR: 10, Coin.SOL: 1}


def test_every_coin_has_a_pinned_count():
    assert set(REQUIRED) == set(Coin) - {Coin.DEMO}   # DEMO: the demo store's coin, on no chain


def order(customer, now):
    return checkout_place_order(
        customer=customer, offer=Offer.objects.get(slug="rtx-3090"), site=Site.objects.get(code="DFW-1"),
        term="week", image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY, now=now)


@pytest.mark.parametrize("coin,required", REQUIRED.items(), ids=[c.value for c in REQUIRED])
def test_one_confirmation_short_is_not_credited_the_required_count_is(catalog, customer, coin, required):
    now = timezone.now().replace(microsecond=0)
    lease, invoice = order(customer, now)
    quote = quote_for(invoice, coin, now)
    tx = txid()

    apply(quote, [paid(quote, quote.amount, required - 1, tx=tx)], now + timedelta(minutes=1))
    assert fresh(invoice).state == Invoice.State.OPEN and fresh(lease).state == LeaseState.PENDING
    assert Payment.objects.get(txid=tx).state == Payment.State.SEEN and int(fresh(quote).confirmed) == 0

    apply(quote, [paid(quote, quote.amount, required, tx=tx)], now + timedelta(minutes=2))
    assert Payment.objects.get(txid=tx).state == Payment.State.CONFIRMED
    assert fresh(invoice).state == Invoice.State.PAID and fresh(lease).state == LeaseState.PROVISIONING


def test_the_speed_policy_never_goes_below_one_confirmation(catalog, customer, settings):
    """An operator's policy of 0 confirmations for small amounts still waits for one: an
    unconfirmed (mempool) payment can be double-spent, so it never pays an invoice."""
    settings.PAYMENT_SPEED_POLICY = "100000:0"  # under $1,000: "no confirmation needed"
    now = timezone.now().replace(microsecond=0)
    lease, invoice = order(customer, now)
    quote, tx = quote_for(invoice, Coin.BTC, now), txid()
    apply(quote, [paid(quote, quote.amount, 0, tx=tx)], now + timedelta(minutes=1))
    assert Payment.objects.get(txid=tx).state == Payment.State.SEEN
    assert fresh(invoice).state == Invoice.State.OPEN and fresh(lease).state == LeaseState.PENDING
    apply(quote, [paid(quote, quote.amount, 1, tx=tx)], now + timedelta(minutes=2))
    assert fresh(invoice).state == Invoice.State.PAID and fresh(lease).state == LeaseState.PROVISIONING

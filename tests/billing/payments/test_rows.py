"""What a detected payment's row and its wallet's paid index record — the times and
the block a payment was first seen and confirmed at, and the highest derivation index paid
(the gap-limit warning reads it), of that coin's wallet only and never lowered."""
from datetime import timedelta

import pytest

from billing.models import CoinWallet, Payment
from billing.payments.quotes import quote_create
from tests.billing.payments_helpers import DUE, apply, paid, set_rate
from tests.factories import order

pytestmark = pytest.mark.django_db


def test_a_payment_seen_in_the_mempool_then_mined_records_when_each_happened(placed, t0):
    _, _, quote = placed
    seen = paid(quote, DUE, 0)
    apply(quote, [seen], t0 + timedelta(minutes=2))
    row = Payment.objects.get(txid=seen.txid)
    assert (row.state, row.confirmed_at, row.block_hash, row.block_height) == (Payment.State.SEEN, None, "", None)
    mined = paid(quote, DUE, 6, seen.txid)
    apply(quote, [mined], t0 + timedelta(minutes=9))
    row.refresh_from_db()
    assert (row.state, row.confirmed_at, row.block_hash, row.block_height) == (
        Payment.State.CONFIRMED, t0 + timedelta(minutes=9), "b" * 64, 100)


def test_a_payment_first_seen_with_its_confirmations_is_confirmed_when_seen(placed, t0):
    _, _, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=4))
    row = Payment.objects.get(txid=p.txid)
    assert (row.state, row.confirmed_at) == (Payment.State.CONFIRMED, t0 + timedelta(minutes=4))


def test_the_paid_index_is_the_highest_paid_of_that_coins_wallet(catalog, customer, coins, t0):
    set_rate("LTC", "100", t0)
    first, second = (order(customer, t0, pay=False)[1] for _ in range(2))
    low = quote_create(invoice=first, coin="LTC", now=t0)
    CoinWallet.objects.filter(coin="LTC").update(next_index=5)
    high = quote_create(invoice=second, coin="LTC", now=t0)
    usdt = quote_create(invoice=first, coin="USDT", now=t0)  # an ERC-20: the ETH wallet's index
    assert (low.derivation_index, high.derivation_index) == (0, 5)
    apply(high, [paid(high, 1, 0)], t0)
    apply(low, [paid(low, 1, 0)], t0)     # a lower index paid later does not lower it
    wallets = dict(CoinWallet.objects.values_list("coin", "highest_paid_index"))
    assert (wallets["LTC"], wallets["ETH"]) == (5, -1)   # the ETH wallet saw no payment
    apply(usdt, [paid(usdt, 1, 0)], t0)
    assert CoinWallet.objects.get(coin="ETH").highest_paid_index == usdt.derivation_index == 0
    assert CoinWallet.objects.get(coin="LTC").highest_paid_index == 5

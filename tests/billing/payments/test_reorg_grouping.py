"""How one watcher pass reaches its quotes (billing.payments.services.payments_apply_scan,
_group_by_quote, _reorged_by_quote): a payment belongs to the quote of ITS coin at its address
(Solana: its reference, the merchant address being shared), a reorg or a drop names one
output of one coin's transaction and touches only that payment, and every quote named by the
pass moves in the same pass. Amounts are base units (litoshi) and cents."""
from datetime import timedelta
from decimal import Decimal

import pytest

from billing.models import Invoice, LedgerEntry, Payment, PaymentReview, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, DetectedPayment, ScanResult
from billing.payments.coins.utxo import UtxoAdapter
from billing.payments.services import payments_apply_scan, quote_create
from tests.billing.payments_helpers import (
    DUE,
    apply,
    balance,
    fresh,
    ltc_account_key,
    offline_adapters,
    paid,
    txid,
)
from tests.factories import order

pytestmark = pytest.mark.django_db

PS = Payment.State


def kinds(customer):
    return [(e.kind, e.amount_cents) for e in LedgerEntry.objects.filter(account__customer=customer).order_by("pk")]


def states():
    return sorted(Payment.objects.values_list("txid", "output_index", "state", "invalid_reason"))


def test_a_reorg_takes_back_only_the_reported_output_not_its_sibling_in_the_same_transaction(placed, customer, t0):
    """One transaction pays the quote with two outputs (n=0 and n=1, $32.50 each). The chain
    reports output 1 gone: only that payment is reorged and only its $32.50 is taken back."""
    _, invoice, quote = placed
    tx = txid()
    apply(quote, [paid(quote, DUE // 2, 6, tx, 0), paid(quote, DUE // 2, 6, tx, 1)], t0 + timedelta(minutes=3))
    assert fresh(invoice).state == Invoice.State.PAID and balance(customer) == 0

    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(tx, 1)])
    assert states() == [(tx, 0, PS.CONFIRMED, ""), (tx, 1, PS.REORGED, "reorged")]
    assert kinds(customer)[-1] == ("clawback", -3250) and balance(customer) == -3250


def test_a_reorg_reported_by_another_coins_watcher_leaves_a_payment_with_the_same_txid_alone(placed, customer, t0):
    """Transaction ids are per chain (and shared on one chain by ETH and its tokens): the USDT
    watcher reporting (txid, 0) gone says nothing about the LTC payment with that txid."""
    _, invoice, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    result = apply(Coin.USDT, [], t0 + timedelta(minutes=10), reorged=[(p.txid, 0)])
    assert result.quotes == []
    assert states() == [(p.txid, 0, PS.CONFIRMED, "")]
    assert fresh(invoice).state == Invoice.State.PAID and balance(customer) == 0
    assert not LedgerEntry.objects.filter(kind="clawback").exists()


def test_a_drop_reported_by_another_coins_watcher_leaves_a_payment_with_the_same_txid_alone(placed, t0):
    _, invoice, quote = placed
    p = paid(quote, DUE, 1)
    apply(quote, [p], t0 + timedelta(minutes=3))
    scan = ScanResult([], {}, [], [(p.txid, 0, "double_spent")])
    assert payments_apply_scan(coin="USDT", scan=scan, now=t0 + timedelta(minutes=4)).quotes == []
    assert states() == [(p.txid, 0, PS.SEEN, "")]


def test_a_payment_in_one_coin_to_another_coins_quote_address_is_not_that_quotes_payment(placed, t0):
    """A USDT transfer to the LTC quote's address is not an LTC payment: the pass reports it as
    matching no quote of its coin, records no payment and leaves the invoice open."""
    _, invoice, quote = placed
    usdt = DetectedPayment(Coin.USDT, txid(), 0, quote.address, DUE, 12, "b" * 64, 100)
    result = apply(Coin.USDT, [usdt], t0 + timedelta(minutes=3))
    assert (result.quotes, result.unknown) == ([], [usdt])
    assert not Payment.objects.exists() and fresh(invoice).state == Invoice.State.OPEN


def test_a_payment_to_no_quote_is_reported_unknown_next_to_the_quotes_it_moved(placed, t0):
    _, invoice, quote = placed
    mine, stray = paid(quote, DUE, 6), DetectedPayment(Coin.LTC, txid(), 0, "rltc1qnobody", 5_000, 6, "b" * 64, 100)
    result = apply(quote, [stray, mine], t0 + timedelta(minutes=3))
    assert (result.quotes, result.unknown) == ([quote.pk], [stray])
    assert list(Payment.objects.values_list("txid", "quote_id")) == [(mine.txid, quote.pk)]
    assert fresh(invoice).state == Invoice.State.PAID


def test_one_pass_reorging_and_dropping_payments_of_two_quotes_moves_both(placed, customer, t0):
    """A pass names a confirmed payment of quote A gone (reorg) and an unconfirmed one of quote
    B dropped (double-spent): each quote gets its own payment marked with its own reason, A's
    invoice is taken back ($65.00), and the pass returns both quotes, in order."""
    _, invoice_a, a = placed
    _, invoice_b = order(customer, t0, pay=False)
    b = quote_create(invoice=invoice_b, coin="LTC", now=t0)
    pa, pb = paid(a, DUE, 6), paid(b, DUE, 1)
    apply(a, [pa, pb], t0 + timedelta(minutes=3))
    assert fresh(invoice_a).state == Invoice.State.PAID and fresh(invoice_b).state == Invoice.State.OPEN

    scan = ScanResult([], {}, [(pa.txid, 0)], [(pb.txid, 0, "double_spent")])
    result = payments_apply_scan(coin="LTC", scan=scan, now=t0 + timedelta(minutes=10))
    assert result.quotes == sorted([a.pk, b.pk]) and result.unknown == []
    assert dict(Payment.objects.values_list("quote_id", "state")) == {a.pk: PS.REORGED, b.pk: PS.INVALID}
    assert dict(Payment.objects.values_list("quote_id", "invalid_reason")) == {a.pk: "reorged", b.pk: "double_spent"}
    assert kinds(customer)[-1] == ("clawback", -6500)


def test_an_output_index_reported_as_text_still_names_the_payment(placed, t0):
    """Watchers persist the outputs they follow in a JSON cursor; an index that comes back as
    text ("0") names the same payment as 0."""
    _, _, quote = placed
    p = paid(quote, DUE, 6)
    apply(quote, [p], t0 + timedelta(minutes=3))
    apply(quote, [], t0 + timedelta(minutes=10), reorged=[(p.txid, "0")])
    assert states() == [(p.txid, 0, PS.REORGED, "reorged")]


def sol_quote(invoice, reference, now):
    """A Solana Pay quote: every quote has the merchant's one address, told apart by reference."""
    return Quote.objects.create(
        invoice=invoice, coin=Coin.SOL, address="MerchantWa11et", reference=reference, amount=10_000,
        usd_cents=invoice.amount_cents, rate_usd_per_coin=Decimal("100"), rate_source="operator", rate_at=now,
        uri=f"solana:MerchantWa11et?reference={reference}", created_at=now, expires_at=now + timedelta(minutes=30))


def test_solana_payments_go_to_the_quote_of_their_reference_not_the_shared_address(catalog, customer, coins, t0):
    _, first = order(customer, t0, pay=False)
    _, second = order(customer, t0, pay=False)
    q1, q2 = sol_quote(first, "Ref1111", t0), sol_quote(second, "Ref2222", t0)
    p = paid(q2, q2.amount, 1)  # a Solana payment's address is the reference it carried
    assert apply(Coin.SOL, [p], t0 + timedelta(minutes=3)).quotes == [q2.pk]
    assert Payment.objects.get().quote_id == q2.pk and not q1.payments.exists()
    assert fresh(second).state == Invoice.State.PAID and fresh(first).state == Invoice.State.OPEN


def test_the_confirmations_required_are_the_configured_adapters(placed, t0):
    """LTC needs 6 confirmations by default; an operator's adapter set to 2 credits at 2."""
    _, invoice, quote = placed
    adapters = {**offline_adapters(),
                Coin.LTC: UtxoAdapter(Coin.LTC, ltc_account_key(), network="regtest", required_confirmations=2)}
    with coins_config.use_adapters(adapters):
        apply(quote, [paid(quote, DUE, 2)], t0 + timedelta(minutes=3))
    assert Payment.objects.get().state == PS.CONFIRMED and fresh(invoice).state == Invoice.State.PAID


def test_a_pass_reports_another_wallet_coin_sent_to_a_quote_once_it_has_its_confirmations(catalog, customer, coins, t0):
    """65 USDC sent to a USDT quote's address (one wallet, one address): the USDC pass records
    no payment and pays nothing; at 11 of USDC's 12 confirmations nobody is asked yet, at 12 an
    operator's review opens for the 65_000_000 units sent, worth $65.00 (6500 cents)."""
    _, invoice = order(customer, t0, pay=False)
    quote = quote_create(invoice=invoice, coin="USDT", now=t0)
    usdc = DetectedPayment(Coin.USDC, txid(), 0, quote.address, 65_000_000, 11, "b" * 64, 100)
    result = apply(Coin.USDC, [usdc], t0 + timedelta(minutes=2))
    assert (result.quotes, result.unknown) == ([], [usdc]) and not PaymentReview.objects.exists()

    confirmed = DetectedPayment(Coin.USDC, usdc.txid, 0, quote.address, 65_000_000, 12, "b" * 64, 100)
    apply(Coin.USDC, [confirmed], t0 + timedelta(minutes=5))
    assert list(PaymentReview.objects.values_list("kind", "quote_id", "sent_coin", "amount", "proposed_cents",
                                                  "created_at")) == [
        ("misdirected", quote.pk, "USDC", 65_000_000, 6500, t0 + timedelta(minutes=5))]
    assert not Payment.objects.exists() and fresh(invoice).state == Invoice.State.OPEN

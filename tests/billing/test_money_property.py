"""Money on real chains, a property: for any interleaving of payments, confirmations, reorgs, double-spends,
fee bumps, re-mined payments, refunds (the customer's and the operator's), operator approvals,
time passing and lifecycle sweeps, what the customer holds from one quote — the balance plus
the service the invoice still buys (paid, not refunded) — is never more than the chain holds
for the quote (confirmed payments still on it, at the quote's rate) plus what operators
approved by hand.

The chain is the test's model: the payments it reported and what became of them (the
watchers' contract with ``payments_apply_scan``; the adapters are tested against real nodes
in tests/billing/payments/coins and tests/billing/payments/test_adversarial_chains.py). A payment once confirmed
counts until it is reported reorged or dropped (a reorg that puts it back in the mempool
keeps it counted: ``services._payment_update``)."""
from datetime import timedelta

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from billing.models import Invoice, LedgerEntry, PaymentReview
from billing.payments.coins.base import Coin, DetectedPayment, ScanResult
from billing.payments.credits import payment_review_credit
from billing.payments.pricing import PaymentError, cents_at
from billing.payments.services import payments_apply_scan, quote_create
from billing.refunds import lease_refund
from billing.services import BillingError, account_for
from ops.backoffice.services import invoice_refund_to_balance
from ops.lifecycle import run_lifecycle
from tests.billing.payments_helpers import offline_coins, set_rate, txid
from tests.factories import order

DUE = 65_000_000  # $65 at $100/LTC
AMOUNTS = [DUE, DUE // 2, DUE + 10_000_000, 100_000, 2 * DUE]

ops = st.one_of(
    st.tuples(st.just("pay"), st.sampled_from(AMOUNTS), st.booleans()),
    st.tuples(st.sampled_from(["confirm", "reorg", "drop", "remine", "bump", "unmine"]), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.sampled_from([5, 20, 45, 400])),
    st.tuples(st.sampled_from(["sweep", "refund_customer", "approve"])),
    st.tuples(st.just("refund_operator"), st.sampled_from([None, 1000])),
)


class Chain:
    """What the test told the watcher: payment → (amount, confirmed, on the chain)."""

    def __init__(self, quote):
        self.quote, self.payments = quote, {}

    def report(self, now, *, found=(), reorged=(), dropped=()):
        payments_apply_scan(coin="LTC", scan=ScanResult(list(found), {}, list(reorged), list(dropped)), now=now)

    def detected(self, tx, now, confirmations):
        return DetectedPayment(Coin.LTC, tx, 0, self.quote.address, self.payments[tx]["amount"], confirmations,
                               "b" * 64 if confirmations else None, 100 if confirmations else None,
                               chain_time=int(self.payments[tx]["seen"].timestamp()))

    def value_cents(self) -> int:
        units = sum(p["amount"] for p in self.payments.values() if p["counted"])
        return cents_at(units, self.quote.rate_usd_per_coin, "LTC")


def holdings(customer, invoice) -> int:
    invoice.refresh_from_db()
    service = 0
    if invoice.state == Invoice.State.PAID and not LedgerEntry.objects.filter(
            idempotency_key=f"late:{invoice.pk}").exists():
        service = invoice.amount_cents - invoice.refunded_cents
    return account_for(customer).balance_cents + service


def step(op, chain, state, customer, operator, lease, invoice):
    now = state["now"]
    txs = list(chain.payments)
    pick = txs[op[1] % len(txs)] if txs and op[0] in ("confirm", "reorg", "drop", "remine", "bump", "unmine") else None
    kind = op[0]
    if kind == "pay":
        tx = txid()
        chain.payments[tx] = {"amount": op[1], "seen": now, "counted": op[2]}
        chain.report(now, found=[chain.detected(tx, now, 6 if op[2] else 0)])
    elif pick and kind in ("confirm", "remine"):
        chain.payments[pick]["counted"] = True
        chain.report(now, found=[chain.detected(pick, now, 6)])
    elif pick and kind == "unmine":  # a reorg put it back in the mempool: reported unconfirmed
        chain.report(now, found=[chain.detected(pick, now, 0)])
    elif pick and kind == "reorg":
        chain.payments[pick]["counted"] = False
        chain.report(now, reorged=[(pick, 0)])
    elif pick and kind == "drop":
        chain.payments[pick]["counted"] = False
        chain.report(now, dropped=[(pick, 0, "double_spent")])
    elif pick and kind == "bump":  # same output, new txid, in the mempool
        chain.payments[pick]["counted"] = False
        new = txid()
        chain.payments[new] = {"amount": chain.payments[pick]["amount"], "seen": now, "counted": False}
        chain.report(now, found=[chain.detected(new, now, 0)], dropped=[(pick, 0, "double_spent")])
    elif kind == "advance":
        state["now"] = now + timedelta(minutes=op[1])
    elif kind == "sweep":
        run_lifecycle(now)
    elif kind == "refund_customer":
        try:
            lease_refund(lease=lease, actor=customer, now=now)
        except BillingError:
            pass
    elif kind == "refund_operator":
        try:
            invoice_refund_to_balance(invoice=invoice, actor=operator, reason="goodwill", now=now, cents=op[1])
        except BillingError:
            pass
    elif kind == "approve":
        review = PaymentReview.objects.filter(state=PaymentReview.State.OPEN).order_by("pk").first()
        if review is not None:
            try:
                credited = payment_review_credit(review=review, actor=operator, now=now)
            except PaymentError:
                return
            state["approved"] += int(LedgerEntry.objects.get(idempotency_key=f"review:{credited.pk}").amount_cents)


@pytest.mark.django_db
@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=12))
def test_the_ledger_never_credits_more_than_the_chain_holds_plus_approvals(
        catalog, customer, operator, settings, script):
    settings.RATE_MAX_AGE_MINUTES = 100_000  # one rate throughout: the quote's is the fresh one
    settings.REFUNDS_PER_MONTH = 100
    with transaction.atomic(), offline_coins():
        from django.utils import timezone

        t0 = timezone.now().replace(microsecond=0)
        set_rate("LTC", "100", t0)
        lease, invoice = order(customer, t0, pay=False)
        quote = quote_create(invoice=invoice, coin="LTC", now=t0)
        chain = Chain(quote)
        state = {"now": t0 + timedelta(minutes=1), "approved": 0}
        for op in script:
            step(op, chain, state, customer, operator, lease, invoice)
            held, allowed = holdings(customer, invoice), chain.value_cents() + state["approved"]
            assert held <= allowed, (op, held, allowed, list(LedgerEntry.objects.values_list(
                "kind", "amount_cents", "idempotency_key")))
        transaction.set_rollback(True)

"""What the generated chain histories share (tests/billing/payments/test_generated_histories.py on
litecoind and anvil, test_generated_histories_monero.py on monerod): the reviews that hold money
for an operator, the killed watcher, the per-invoice invariants, and the replay of a shrunk
history kept as an explicit test."""
from collections.abc import Callable

from billing.models import Invoice, Payment, PaymentReview, Quote
from billing.payments import config as coins_config
from billing.payments.credits import payment_review_credit
from billing.payments.pricing import PaymentError

HELD_KINDS = ("no_rate", "over_cap", "misdirected", "after_window")  # money waiting for an operator


class Killed(BaseException):
    """The watcher process dies between applying a pass and saving its cursor."""


def invoices_paid_once_and_held_no_longer(customer, on_a_chain_or_in_a_pool: Callable[[Payment], bool]) -> None:
    """No invoice paid twice: a quote settled for its order paid it (one that settled after
    the order closed — seen in time, confirmed past the monitoring window — is on the
    balance: paid late). No GPU held past its window: an open order's hold ends by its own
    window, its quotes' expiries, or the monitoring window of a payment still confirming
    (in a pool, or mined with fewer confirmations than its quote needs)."""
    for invoice in Invoice.objects.filter(customer=customer):
        settled = (Quote.objects.filter(invoice=invoice, state=Quote.State.SETTLED, payments__in_settlement=True)
                   .exclude(exception=Quote.Exception_.LATE))
        assert invoice.state == Invoice.State.PAID or not settled.exists(), (invoice.pk, invoice.state)
        if invoice.state != Invoice.State.OPEN or invoice.expires_at is None:
            continue
        quotes = list(Quote.objects.filter(invoice=invoice))
        pending = Payment.objects.filter(quote__in=quotes, state=Payment.State.SEEN)
        allowed = [invoice.lease.pay_by if invoice.lease_id and invoice.lease.pay_by else invoice.created_at]
        allowed += [q.expires_at for q in quotes]
        allowed += [p.first_seen_at + coins_config.monitoring_window() for p in pending
                    if on_a_chain_or_in_a_pool(p)]
        assert invoice.expires_at <= max(allowed), (invoice.pk, invoice.expires_at, max(allowed))


def replay(machine, steps, pick: Callable, invariants: list[str]) -> None:
    """A shrunk history as Hypothesis ran it: the rule calls in order with the invariants after
    each, then the teardown's settlement (the store must hold exactly what the chains hold).
    An argument "@x" stands for a drawn choice: ``pick(machine, "x")`` draws it."""
    try:
        for name in invariants:
            getattr(machine, name)()
        for rule_name, *args in steps:
            args = [pick(machine, a[1:]) if isinstance(a, str) and a.startswith("@") else a for a in args]
            getattr(machine, rule_name)(*args)
            for name in invariants:
                getattr(machine, name)()
    finally:
        machine.teardown()


def watch_killed_after_applying(coin: str, now) -> None:
    """One watcher pass that dies (SIGKILL) between applying what it found and saving its
    cursor: the next pass starts from the old cursor and finds it all again."""
    from billing.payments import services as payment_services

    real = payment_services.payments_apply_scan

    def apply_then_die(**kwargs):
        real(**kwargs)
        raise Killed

    payment_services.payments_apply_scan = apply_then_die
    try:
        payment_services.watch_coin(coin=coin, now=now)
    except Killed:
        pass
    finally:
        payment_services.payments_apply_scan = real


def held_reviews_exist() -> bool:
    return PaymentReview.objects.filter(state=PaymentReview.State.OPEN, kind__in=HELD_KINDS).exists()


def credit_first_held_review(operator, now) -> bool:
    """The operator credits the oldest review that holds money; False when it is refused."""
    review = PaymentReview.objects.filter(state=PaymentReview.State.OPEN, kind__in=HELD_KINDS).order_by("pk").first()
    if review is None:
        return False
    try:
        payment_review_credit(review=review, actor=operator, now=now)
    except PaymentError:
        return False
    return True

"""The price guard (docs/adr/0006): a rate is used only when a strict majority of the fresh
answers agree within PRICE_SOURCES_TOLERANCE_BPS of their median, enough of them
(PRICE_SOURCES_MIN, or fewer held to the last rate a quorum or an operator set), and it moved
less than PRICE_MAX_MOVE_BPS from the last accepted rate; otherwise quoting in the coin stops
with a message for the customer, the dashboard says why, and nothing already quoted changes.

The sources here are objects with ``rate(coin, now)`` handed to ``rates_refresh`` (the HTTP
side of a source is tests/billing/payments/coins/test_rate_sources.py and payments/test_price_sources.py)."""
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from billing.models import CoinRate, CoinRateGuard, Invoice, LedgerEntry, PaymentReview, Quote
from billing.payments.coins.base import Coin
from billing.payments.coins.rates import Rate, judge
from billing.payments.credits import payment_review_credit
from billing.payments.pricing import PaymentError, coin_rate_set, rate_for, rates_refresh
from billing.payments.services import quote_create, sweep_expire_quotes
from inventory.models import AuditEntry
from rental.models import LeaseState
from tests.billing.payments_helpers import apply, fresh, paid
from tests.factories import order

TOL, MOVE = 200, 1000  # the defaults: 2 % agreement, 10 % move


class Source:
    """A price source that answers what the test says (None: it does not answer)."""

    def __init__(self, name: str, usd: str | None = None):
        self.name, self.usd = name, usd

    def rate(self, coin, now):
        from billing.payments.coins.rates import RateUnavailable

        if self.usd is None:
            raise RateUnavailable(f"{self.name}: down")
        return Rate(Coin(coin), Decimal(self.usd), self.name, now)


def refresh(now, *sources, coin="LTC"):
    return rates_refresh(coins=[coin], now=now, sources=list(sources))[coin]


def stopped(coin="LTC") -> CoinRateGuard | None:
    return CoinRateGuard.objects.filter(coin=coin, stopped_at__isnull=False).first()


def dashboard_alerts(now) -> list[str]:
    from ops.backoffice.dashboard import dashboard

    return dashboard(now).alerts


@pytest.fixture
def anchored(db, coins, operator, t0):
    """LTC at $100, set by an operator (the guard's anchor)."""
    return coin_rate_set(coin="LTC", usd_per_coin=Decimal("100"), actor=operator, now=t0 - timedelta(hours=1))


# --- the cases ----------------------------------------------------------------------

def test_one_source_lying_1000x_sells_nothing_and_the_order_waits(anchored, catalog, customer, client, t0,
                                                                   settings):
    """A store with one source (any PRICE_SOURCES_MIN, 1 included): the source answers 1000×
    the price. The rate is refused, quoting in LTC stops with a message (no 500, no quote, the
    order still open and its GPUs held), the dashboard says why; a quote made before keeps its
    locked amount and pays the order at it."""
    settings.PRICE_SOURCES_MIN = 1
    lease, invoice = order(customer, t0, pay=False)
    assert refresh(t0, Source("kraken", "100.5")) == "100.50000000 from 1 source(s)"
    before = quote_create(invoice=invoice, coin="LTC", now=t0)
    assert (before.amount, before.rate_usd_per_coin) == (64_676_617, Decimal("100.5"))

    liar = t0 + timedelta(minutes=1)
    result = refresh(liar, Source("kraken", "100500"))
    assert result.startswith("refused: $100500 is 99900.00% from the last accepted rate $100.5")
    assert CoinRate.objects.get(coin="LTC").usd_per_coin == Decimal("100.5")  # the last accepted stays
    _, other = order(customer, liar, pay=False, offer="rtx-4090")
    client.force_login(customer)
    page = client.post(f"/pay/invoice/{other.pk}/", {"coin": "LTC"}, follow=True)
    assert page.status_code == 200
    assert "LTC payments are paused: our price sources do not agree" in page.content.decode()
    assert Quote.objects.filter(invoice=other).count() == 0 and fresh(other).state == Invoice.State.OPEN
    alerts = [a for a in dashboard_alerts(liar) if a.startswith("LTC quotes refused since")]
    assert len(alerts) == 1 and "99900.00% from the last accepted rate" in alerts[0]
    assert "their median: $100500 from median:kraken" in alerts[0]

    apply(before, [paid(before, before.amount, 6)], liar + timedelta(minutes=1))  # the old quote, paid
    assert fresh(before).state == Quote.State.SETTLED and fresh(invoice).state == Invoice.State.PAID
    assert fresh(lease).state == LeaseState.PROVISIONING and not LedgerEntry.objects.exists()


def test_two_sources_disagreeing_stop_quoting_until_they_agree_again(anchored, catalog, customer, t0):
    """Two sources, one of them 1000× off: no "median" that is their mean — refused; once the
    two agree again (within 2 %) their rate is used and quoting resumes, each change audited."""
    _, invoice = order(customer, t0, pay=False)
    result = refresh(t0, Source("alpha", "101"), Source("beta", "101000"))
    assert result.startswith("refused: the sources disagree: 1 of 2 within 2.00% of their median")
    with pytest.raises(PaymentError, match="LTC payments are paused"):
        quote_create(invoice=invoice, coin="LTC", now=t0)
    assert refresh(t0 + timedelta(minutes=1), Source("alpha", "101"), Source("beta", "102.9")) \
        == "101.00000000 from 2 source(s)"
    assert stopped() is None
    assert quote_create(invoice=invoice, coin="LTC", now=t0 + timedelta(minutes=1)).rate_usd_per_coin == 101
    assert [e.action for e in AuditEntry.objects.filter(action__startswith="coin_rate_").order_by("pk")] == [
        "coin_rate_set", "coin_rate_refused", "coin_rate_resumed"]


def test_a_jump_beyond_the_bound_stops_quoting_even_when_every_source_agrees(anchored, t0):
    """Three sources agreeing on +15 % in one round: refused until an operator confirms it
    (sets it by hand) or the sources come back within the bound."""
    sources = [Source(n, v) for n, v in (("a", "115"), ("b", "115.5"), ("c", "114.8"))]
    assert refresh(t0, *sources).startswith("refused: $115 is 15.00% from the last accepted rate $100")
    guard = stopped()
    assert guard.proposed_usd_per_coin == Decimal("115") and guard.proposed_source == "median:a,b,c"
    assert refresh(t0 + timedelta(minutes=1), *sources).startswith("refused:")
    assert fresh(guard).stopped_at == t0  # since the first refusal; audited once
    assert AuditEntry.objects.filter(action="coin_rate_refused").count() == 1
    coin_rate_set(coin="LTC", usd_per_coin=guard.proposed_usd_per_coin, actor=None, now=t0 + timedelta(minutes=2))
    assert stopped() is None and rate_for(Coin.LTC, t0 + timedelta(minutes=2)).usd_per_coin == 115


def test_a_late_payment_is_not_credited_at_a_refused_rate(anchored, catalog, customer, operator, t0, settings):
    """The issue's $10 for a $0.01 payment: the quote expired, the one source then answers
    1000× too low a price... or too high: either way the rate is refused, so a late payment is
    held for an operator (no rate) instead of credited at it; the operator cannot credit it
    either until a rate is accepted again, then it is credited at that rate."""
    settings.PRICE_SOURCES_MIN = 1
    assert refresh(t0, Source("kraken", "100")) == "100.00000000 from 1 source(s)"
    _, invoice = order(customer, t0, pay=False)
    quote = quote_create(invoice=invoice, coin="LTC", now=t0)
    later = quote.expires_at + timedelta(minutes=5)
    sweep_expire_quotes(later)
    assert fresh(quote).state == Quote.State.EXPIRED
    assert refresh(later, Source("kraken", "100000")).startswith("refused:")
    apply(quote, [paid(quote, 10_000, 6)], later + timedelta(minutes=1))  # 0.0001 LTC: one cent
    review = PaymentReview.objects.get()
    assert (review.kind, review.proposed_cents, int(review.amount)) == (PaymentReview.Kind.NO_RATE, None, 10_000)
    assert not LedgerEntry.objects.exists()
    with pytest.raises(PaymentError, match="LTC payments are paused"):
        payment_review_credit(review=review, actor=operator, now=later + timedelta(minutes=2))
    coin_rate_set(coin="LTC", usd_per_coin=Decimal("100"), actor=operator, now=later + timedelta(minutes=3))
    payment_review_credit(review=review, actor=operator, now=later + timedelta(minutes=4))
    assert [(e.kind, e.amount_cents) for e in LedgerEntry.objects.all()] == [("late_payment", 1)]


# --- one source: refuse rather than trust ----------------------------------------------------

def test_a_first_rate_from_one_source_waits_for_an_operator(db, coins, operator, t0, settings):
    settings.PRICE_SOURCES_MIN = 1  # even a store that set its quorum to one
    assert refresh(t0, Source("kraken", "100")).startswith(
        "refused: a first rate from 1 source(s) needs an operator's confirmation (kraken $100)")
    assert not CoinRate.objects.exists()
    with pytest.raises(PaymentError, match="LTC payments are paused"):
        rate_for(Coin.LTC, t0)
    coin_rate_set(coin="LTC", usd_per_coin=stopped().proposed_usd_per_coin, actor=operator, now=t0)
    assert refresh(t0 + timedelta(minutes=16), Source("kraken", "101")) == "101.00000000 from 1 source(s)"
    assert rate_for(Coin.LTC, t0 + timedelta(minutes=16)).usd_per_coin == 101


def test_one_source_cannot_walk_the_price_away_step_by_step(anchored, t0):
    """Below the quorum (two by default) every step is held to the last rate a quorum or an
    operator set, not only to the previous step."""
    steps = [("105", "105.00000000 from 1 source(s)"), ("109", "109.00000000 from 1 source(s)")]
    for minute, (usd, expected) in enumerate(steps, start=1):
        assert refresh(t0 + timedelta(minutes=minute), Source("kraken", usd)) == expected
    result = refresh(t0 + timedelta(minutes=3), Source("kraken", "112"))  # 2.75 % from 109, 12 % from 100
    assert result.startswith("refused: 1 source(s) of the 2 needed, and $112 is 12.00% from $100")
    # a quorum moves the anchor: two sources agreeing on 109.5 are taken, and then one alone near it
    assert refresh(t0 + timedelta(minutes=4), Source("kraken", "109.5"), Source("bitstamp", "110")) \
        == "109.50000000 from 2 source(s)"
    assert CoinRateGuard.objects.get(coin="LTC").anchor_usd_per_coin == Decimal("109.5")
    assert refresh(t0 + timedelta(minutes=5), Source("kraken", "112")) == "112.00000000 from 1 source(s)"


def test_a_source_that_is_down_is_left_out_and_named_in_the_refusal(anchored, t0, settings):
    settings.PRICE_SOURCES_MIN = 3
    result = refresh(t0, Source("a", "101"), Source("b", None), Source("c", "150"))
    assert result.startswith("refused: the sources disagree: 1 of 2") and result.endswith("left out: b: down")


# --- the property --------------------------------------------------------------------------

PRICE = Decimal("100")
honest = st.integers(-TOL // 4, TOL // 4).map(lambda bps: PRICE * (10_000 + bps) / 10_000)
lying = st.one_of(st.decimals(Decimal("0.01"), Decimal("1000000"), places=2),
                  honest.map(lambda v: v * 1000), honest.map(lambda v: v / 1000))


@hsettings(max_examples=500, deadline=None)
@given(honest_answers=st.lists(honest, min_size=0, max_size=5), lies=st.lists(lying, max_size=5),
       quorum=st.integers(1, 4), last=st.sampled_from([None, PRICE]), anchor=st.sampled_from([None, PRICE]),
       order_seed=st.randoms(use_true_random=False))
def test_any_answers_give_a_rate_near_the_honest_ones_or_none(honest_answers, lies, quorum, last, anchor,
                                                              order_seed):
    """Whatever the sources answer: when the honest ones are a majority, a rate that is used
    lies within the tolerance of the honest answers; whoever is a majority, it lies within the
    move bound of the last accepted (honest) rate; a first rate needs two agreeing sources."""
    answers = [("honest", v) for v in honest_answers] + [("liar", v) for v in lies]
    if not answers:
        return
    order_seed.shuffle(answers)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    fresh_rates = [Rate(Coin.LTC, v, f"{kind}{i}", at) for i, (kind, v) in enumerate(answers)]
    verdict = judge(fresh_rates, last=last, anchor=anchor if last is not None else None, quorum=quorum,
                    tolerance_bps=TOL, max_move_bps=MOVE)
    if verdict.rate is None:
        return  # quoting stops: always allowed
    used = verdict.rate.usd_per_coin
    if len(honest_answers) > len(lies):
        low, high = min(honest_answers), max(honest_answers)
        assert low * (10_000 - TOL) / 10_000 <= used <= high * (10_000 + TOL) / 10_000, (answers, used)
    if last is not None:
        assert abs(used - last) * 10_000 < MOVE * last
    else:
        assert len(verdict.agreeing) >= 2


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(honest_answers=st.lists(honest, min_size=1, max_size=4), lies=st.lists(lying, max_size=3),
       rate_before=st.booleans())
def test_quotes_are_made_at_a_rate_near_the_honest_answers_or_not_at_all(
        catalog, customer, coins, t0, honest_answers, lies, rate_before):
    """End to end, through the refresh, the stored rate and quote_create: after any round of
    answers (honest ones a majority), a new quote locks a rate within the tolerance of the
    honest answers, or is refused with the paused-payments message — and a quote made before
    the round keeps its amount. Each example runs in a savepoint rolled back after it."""
    lies = lies[:len(honest_answers) - 1]
    sources = [Source(f"h{i}", str(v)) for i, v in enumerate(honest_answers)]
    sources += [Source(f"l{i}", str(v)) for i, v in enumerate(lies)]
    with transaction.atomic():
        early = None
        _, invoice = order(customer, t0, pay=False)
        if rate_before:  # a rate two sources agreed on a minute ago
            CoinRate.objects.create(coin="LTC", usd_per_coin=PRICE, source="median:a,b", set_at=t0)
            CoinRateGuard.objects.create(coin="LTC", anchor_usd_per_coin=PRICE, anchor_at=t0)
            early = quote_create(invoice=invoice, coin="LTC", now=t0)
        rates_refresh(coins=["LTC"], now=t0 + timedelta(minutes=1), sources=sources)
        _, other = order(customer, t0, pay=False, offer="rtx-4090")
        try:
            quote = quote_create(invoice=other, coin="LTC", now=t0 + timedelta(minutes=1))
        except PaymentError as exc:
            assert "payments are paused" in str(exc)
        else:
            low, high = min(honest_answers), max(honest_answers)
            assert low * (10_000 - TOL) / 10_000 <= quote.rate_usd_per_coin <= high * (10_000 + TOL) / 10_000
        if early is not None:
            assert (fresh(early).rate_usd_per_coin, fresh(early).amount) == (PRICE, early.amount)
        transaction.set_rollback(True)

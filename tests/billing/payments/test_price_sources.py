"""Price sources against a real local HTTP server started by the test: the median of the
fresh, agreeing answers becomes the rate; a stale, failing, malformed or missing source is left
out; fewer agreeing sources than the quorum keep the old rate and stop quoting unless an
operator's rate holds them (the price guard: tests/billing/payments/test_price_guard.py); a fresh
hand-set rate stays; the beat task records its run."""
import json
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from billing.models import CoinRate, JobRun
from billing.payments.pricing import coin_rate_set, rates_refresh
from billing.payments.services import quote_create
from billing.tasks import refresh_rates
from tests.billing.payments_helpers import offline_coins
from tests.factories import order

NOW = datetime.now(UTC).replace(microsecond=0)


class Feeds(BaseHTTPRequestHandler):
    """/<name>/<COIN>: canned JSON per feed, changed by the test through ``answers``."""

    answers: dict = {}

    def do_GET(self):  # noqa: N802 - http.server's name
        name = self.path.strip("/").split("/")[0]
        status, body = self.answers.get(name, (404, {"error": "no such feed"}))
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def feeds(settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Feeds)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    settings.PRICE_SOURCES = json.dumps([
        {"name": "alpha", "url": base + "/alpha/{coin}", "path": "data.{coin_lower}.usd"},
        {"name": "beta", "url": base + "/beta/{coin}", "path": "result.0.price", "time_path": "result.0.at"},
        {"name": "gamma", "url": base + "/gamma/{coin}", "path": "price", "time_path": "time"},
        {"name": "delta", "url": base + "/delta/{coin}", "path": "price"},
    ])
    Feeds.answers = {
        "alpha": (200, {"data": {"ltc": {"usd": 101.5}}}),
        "beta": (200, {"result": [{"price": "100.25", "at": int(NOW.timestamp()) - 30}]}),
        "gamma": (200, {"price": 100, "time": (NOW - timedelta(hours=2)).isoformat()}),  # stale
        "delta": (500, {"error": "down"}),
    }
    yield Feeds.answers
    server.shutdown()
    server.server_close()


def test_median_of_the_fresh_sources_becomes_the_rate(db, feeds):
    with offline_coins():
        # The stablecoin first: it is passed over, and the coins after it are still priced.
        assert rates_refresh(coins=["USDT", "LTC"], now=NOW) == {"LTC": "100.25000000 from 2 source(s)"}
    rate = CoinRate.objects.get(coin="LTC")  # of two answers the lower: a value one of them gave
    assert rate.usd_per_coin == Decimal("100.25") and rate.source == "median:alpha,beta"
    assert rate.set_at == NOW - timedelta(seconds=30)  # the older of the two answers
    assert not CoinRate.objects.filter(coin="USDT").exists()  # the peg stays


def test_too_few_fresh_answers_keep_the_old_rate(db, feeds, settings):
    """Two agreeing answers of the three needed, and no rate a quorum or an operator set to
    hold them to: refused, with every left-out source's reason; the old rate stays."""
    settings.PRICE_SOURCES_MIN = 3
    CoinRate.objects.create(coin="LTC", usd_per_coin=Decimal(100), source="median:old",
                            set_at=NOW - timedelta(hours=1))
    result = rates_refresh(coins=["LTC"], now=NOW)
    assert result["LTC"].startswith("refused: 2 source(s) of the 3 needed, and no rate a quorum or an operator set")
    assert "gamma: stale" in result["LTC"] and "delta: HTTPError" in result["LTC"]
    assert CoinRate.objects.get(coin="LTC").usd_per_coin == 100
    feeds["delta"] = (200, b"not json")
    feeds["gamma"] = (200, {"price": "-3", "time": int(NOW.timestamp())})
    assert rates_refresh(coins=["LTC"], now=NOW)["LTC"].startswith("refused:")
    feeds.update(alpha=(500, {}), beta=(500, {}))
    assert rates_refresh(coins=["LTC"], now=NOW)["LTC"].startswith("error: LTC: no fresh source")
    assert CoinRate.objects.get(coin="LTC").usd_per_coin == 100


def test_a_fresh_hand_set_rate_stays_then_the_feeds_take_over(db, feeds, operator):
    coin_rate_set(coin="LTC", usd_per_coin=Decimal("100"), actor=operator, now=NOW)
    assert rates_refresh(coins=["LTC"], now=NOW + timedelta(minutes=5)) == {"LTC": "manual rate kept"}
    assert CoinRate.objects.get(coin="LTC").usd_per_coin == 100
    # beta's answer is now 16.5 min old, so only alpha counts: one source, 1.5 % from the
    # operator's rate (the anchor), within the bound
    assert rates_refresh(coins=["LTC"], now=NOW + timedelta(minutes=16)) == {"LTC": "101.50000000 from 1 source(s)"}


def test_every_coin_is_refreshed_after_one_kept_by_hand_or_without_sources(db, feeds, operator, settings):
    """A hand-set rate kept (fresh by the configured RATE_MAX_AGE_MINUTES, not a default) or a
    coin the sources cannot price is that coin's answer; the coins after it are still priced."""
    settings.PRICE_SOURCES_MIN = 2
    settings.RATE_MAX_AGE_MINUTES = 30
    coin_rate_set(coin="BTC", usd_per_coin=Decimal("90000"), actor=operator, now=NOW - timedelta(minutes=20))
    result = rates_refresh(coins=["BTC", "ETH", "LTC"], now=NOW)
    assert result["BTC"] == "manual rate kept"                  # 20 minutes old: within the 30 configured
    # alpha prices no ETH: beta alone, and no ETH rate before it
    assert result["ETH"].startswith("refused: a first rate from 1 source(s) needs an operator's confirmation")
    assert result["LTC"] == "100.25000000 from 2 source(s)"
    assert CoinRate.objects.get(coin="BTC").usd_per_coin == 90000


def test_a_coin_worth_less_than_a_dollar_takes_its_rate(db, operator):
    rate = coin_rate_set(coin="LTC", usd_per_coin=Decimal("0.35"), actor=operator, now=NOW)
    assert (rate.usd_per_coin, CoinRate.objects.get(coin="LTC").usd_per_coin) == (Decimal("0.35"), Decimal("0.35"))


def test_the_beat_task_prices_quotes(catalog, customer, feeds):
    Feeds.answers["beta"] = (200, {"result": [{"price": "100.25", "at": int(timezone.now().timestamp())}]})
    with offline_coins():
        assert refresh_rates()["LTC"].endswith("from 2 source(s)")
        _, invoice = order(customer, timezone.now(), pay=False)
        quote = quote_create(invoice=invoice, coin="LTC", now=timezone.now())
    assert quote.rate_source == "median:alpha,beta" and quote.rate_usd_per_coin == Decimal("100.25")
    assert JobRun.objects.get(name="refresh_rates").last_result["LTC"].startswith("100.25")


def test_an_operator_rate_is_checked_dated_and_audited(db, operator):
    """coin_rate_set: any case of a known coin, a positive Decimal, dated `now`, the operator's
    source unless another is named; each accepted rate audited with what was set; an unknown
    coin, a float, zero or a negative rate refused with its reason, nothing changed."""
    from billing.payments.pricing import PaymentError
    from inventory.models import AuditEntry

    rate = coin_rate_set(coin="ltc", usd_per_coin=Decimal("101.25"), actor=operator, now=NOW)
    assert (rate.coin, rate.usd_per_coin, rate.source, rate.set_at) == ("LTC", Decimal("101.25"), "operator", NOW)
    rate = coin_rate_set(coin="LTC", usd_per_coin=Decimal("99"), actor=operator, now=NOW + timedelta(minutes=1),
                         source="")
    assert (rate.usd_per_coin, rate.source, CoinRate.objects.count()) == (Decimal("99"), "operator", 1)
    assert [(e.actor, e.object_id, e.detail) for e in AuditEntry.objects.filter(action="coin_rate_set").order_by("pk")] \
        == [(operator, str(rate.pk), {"coin": "LTC", "usd_per_coin": "101.25", "source": "operator"}),
            (operator, str(rate.pk), {"coin": "LTC", "usd_per_coin": "99", "source": "operator"})]
    refusals = []
    for coin, usd in (("DOGE", Decimal("1")), ("LTC", 101.5), ("LTC", Decimal("0")), ("LTC", Decimal("-1"))):
        with pytest.raises(PaymentError) as refused:
            coin_rate_set(coin=coin, usd_per_coin=usd, actor=operator, now=NOW + timedelta(minutes=2))
        refusals.append(str(refused.value))
    assert refusals == ["Unknown coin 'DOGE'."] + ["A rate is a positive decimal number of USD per coin."] * 3
    assert CoinRate.objects.get().usd_per_coin == Decimal("99") and AuditEntry.objects.count() == 2


def test_a_fresh_rate_from_the_feeds_is_replaced_by_the_next_median(db, feeds):
    """Only a rate set by hand is kept while fresh; the feeds' own is refreshed every time."""
    CoinRate.objects.create(coin="LTC", usd_per_coin=Decimal(99), source="median:alpha",
                            set_at=NOW - timedelta(minutes=1))
    assert rates_refresh(coins=["LTC"], now=NOW) == {"LTC": "100.25000000 from 2 source(s)"}
    assert CoinRate.objects.get(coin="LTC").usd_per_coin == Decimal("100.25")

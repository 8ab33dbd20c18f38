"""Rate providers and HTTP price sources, the latter against a local HTTP server the test
starts (never the network): what a source is asked, how its price and time are read (exact
decimals, unix seconds or ISO 8601 with a zone), which answers count (fresh by the configured
age, within the source's timeout), the median of an odd and an even count (the lower middle
answer: a value a source gave), an outlier left out, and what the operator is told when too few
answer."""
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from billing.models import CoinRate
from billing.payments.coins import Coin, PegRates, Rate, StaleRateError, StaticRates
from billing.payments.coins.rates import (
    ChainedRates,
    HttpJsonSource,
    RateUnavailable,
    require_fresh,
)
from billing.payments.pricing import coin_rate_set, rates_refresh

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
HOLD = object()  # an answer that never comes while the test runs (released at teardown)


class Feeds(BaseHTTPRequestHandler):
    """Answers ``answers[path]`` (status, raw JSON bytes); any other path is a 404. Records
    each request's path and headers in ``seen``."""

    answers: dict = {}
    seen: list = []
    release = threading.Event()

    def do_GET(self):  # noqa: N802 - http.server's name
        self.seen.append((self.path, dict(self.headers)))
        answer = self.answers.get(self.path, (404, b'{"error": "unknown"}'))
        if answer is HOLD:
            self.release.wait(3)  # a hung feed; answers late with a valid price
            answer = (200, b'{"price": 200}')
        status, body = answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def feeds():
    Feeds.answers, Feeds.seen, Feeds.release = {}, [], threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Feeds)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    Feeds.release.set()
    server.shutdown()
    server.server_close()


def configure(settings, base, *sources):
    """PRICE_SOURCES from (name, path, time_path[, timeout]); each at <base>/<name>/{coin}."""
    settings.PRICE_SOURCES = [
        {"name": name, "url": f"{base}/{name}/{{coin}}", "path": path, "time_path": time_path, **extra}
        for name, path, time_path, *rest in sources for extra in [rest[0] if rest else {}]]


# -- HTTP JSON price sources ----------------------------------------------------------------
def test_a_source_is_asked_for_the_coin_as_json_and_its_price_read_exactly(feeds):
    """{coin} / {coin_lower} are filled in the URL and paths; the request asks for JSON and
    names the storefront; a JSON number is taken digit for digit (Decimal, never a float);
    an ISO time with "Z" is UTC."""
    Feeds.answers["/spot/LTC"] = (200, b'{"data": {"ltc": {"usd": 64123.123456789012345678, '
                                       b'"at": "2026-01-01T11:59:30Z"}}}')
    source = HttpJsonSource(name="spot", url=feeds + "/spot/{coin}", path="data.{coin_lower}.usd",
                            time_path="data.{coin_lower}.at")
    rate = source.rate(Coin.LTC, NOW)
    assert rate == Rate(Coin.LTC, Decimal("64123.123456789012345678"), "spot", NOW - timedelta(seconds=30))
    assert [(path, headers["Accept"], headers["User-Agent"]) for path, headers in Feeds.seen] == [
        ("/spot/LTC", "application/json", "gpu-storefront-rates")]


def test_a_source_time_may_be_unix_seconds_as_a_number_or_as_text_or_iso_with_an_offset(feeds):
    unix = int((NOW - timedelta(minutes=2)).timestamp())
    Feeds.answers.update({
        "/text/LTC": (200, b'{"price": "100", "time": "%d"}' % unix),
        "/fraction/LTC": (200, b'{"price": "100", "time": %d.75}' % unix),
        "/offset/LTC": (200, b'{"price": "100", "time": "2026-01-01T13:58:00+02:00"}'),
    })
    times = [HttpJsonSource(name=name, url=f"{feeds}/{name}/{{coin}}", path="price", time_path="time")
             .rate(Coin.LTC, NOW).at for name in ("text", "fraction", "offset")]
    assert times == [NOW - timedelta(minutes=2)] * 3


# -- the refresh: which answers count, and the median ----------------------------------------
@pytest.mark.django_db
def test_the_median_is_the_middle_answer_of_an_odd_count_and_the_lower_middle_of_an_even(feeds, settings):
    """The label names the sources that were used, cut to the rate's 40-character source; an
    answer far from the others (a liar, a broken feed) is left out and changes nothing."""
    names = ("coingecko", "kraken", "bitstamp", "coinbase", "binance")
    configure(settings, feeds, *((name, "price", "") for name in names))
    for name, price in zip(names, ("103", "100", "102", "101", "102.5"), strict=True):
        Feeds.answers[f"/{name}/BTC"] = (200, b'{"price": %s}' % price.encode())
    assert rates_refresh(coins=["BTC"], now=NOW) == {"BTC": "102.00000000 from 5 source(s)"}
    rate = CoinRate.objects.get(coin="BTC")
    assert (rate.usd_per_coin, rate.source, rate.set_at) == (
        Decimal("102"), "median:coingecko,kraken,bitstamp,coinbas", NOW)

    Feeds.answers["/binance/BTC"] = (503, b'{"error": "maintenance"}')  # 100, 101, 102, 103 left
    assert rates_refresh(coins=["BTC"], now=NOW) == {"BTC": "101.00000000 from 4 source(s)"}  # not their mean
    assert CoinRate.objects.get(coin="BTC").usd_per_coin == Decimal("101")

    Feeds.answers["/binance/BTC"] = (200, b'{"price": 1000}')  # 1000 is no price the others agree with
    assert rates_refresh(coins=["BTC"], now=NOW) == {"BTC": "101.00000000 from 4 source(s)"}
    assert CoinRate.objects.get(coin="BTC").source == "median:coingecko,kraken,bitstamp,coinbas"


@pytest.mark.django_db
def test_an_answer_counts_while_younger_than_the_configured_rate_max_age(feeds, settings):
    """One source, held to the rate an operator set an hour ago (the price guard's anchor)."""
    configure(settings, feeds, ("kraken", "price", "time"))
    coin_rate_set(coin="LTC", usd_per_coin=Decimal("84"), actor=None, now=NOW - timedelta(hours=1))
    answered_at = NOW - timedelta(minutes=20)
    Feeds.answers["/kraken/LTC"] = (200, b'{"price": "84.5", "time": %d}' % answered_at.timestamp())
    settings.RATE_MAX_AGE_MINUTES = 30
    assert rates_refresh(coins=["LTC"], now=NOW) == {"LTC": "84.50000000 from 1 source(s)"}
    assert CoinRate.objects.get(coin="LTC").set_at == answered_at

    answered_at = NOW - timedelta(minutes=10)
    Feeds.answers["/kraken/LTC"] = (200, b'{"price": "90", "time": %d}' % answered_at.timestamp())
    settings.RATE_MAX_AGE_MINUTES = 5
    assert rates_refresh(coins=["LTC"], now=NOW) == {
        "LTC": "error: LTC: no fresh source; kraken: stale (2026-01-01T11:50:00+00:00)"}
    assert CoinRate.objects.get(coin="LTC").usd_per_coin == Decimal("84.5")


@pytest.mark.django_db
def test_too_few_answers_tell_the_operator_every_source_s_reason(feeds, settings):
    """A time without a timezone, an HTTP error and a stale answer are each refused; the
    result lists them in the sources' order, one "; " apart."""
    settings.PRICE_SOURCES_MIN = 1
    configure(settings, feeds, ("naive", "price", "time"), ("down", "price", ""), ("old", "price", "time"))
    Feeds.answers.update({
        "/naive/LTC": (200, b'{"price": "100", "time": "2026-01-01T11:59:00"}'),
        "/down/LTC": (500, b'{"error": "down"}'),
        "/old/LTC": (200, b'{"price": "100", "time": "2026-01-01T10:00:00+00:00"}'),
    })
    assert rates_refresh(coins=["LTC"], now=NOW) == {"LTC": (
        "error: LTC: no fresh source; naive: ValueError: a source time without a timezone; "
        "down: HTTPError: HTTP Error 500: Internal Server Error; old: stale (2026-01-01T10:00:00+00:00)")}
    assert not CoinRate.objects.exists()


@pytest.mark.django_db
def test_a_source_that_does_not_answer_within_its_timeout_is_left_out(feeds, settings):
    configure(settings, feeds, ("kraken", "price", ""), ("hung", "price", "", {"timeout": 0.3}))
    coin_rate_set(coin="LTC", usd_per_coin=Decimal("99"), actor=None, now=NOW - timedelta(hours=1))
    Feeds.answers.update({"/kraken/LTC": (200, b'{"price": 100}'), "/hung/LTC": HOLD})
    assert rates_refresh(coins=["LTC"], now=NOW) == {"LTC": "100.00000000 from 1 source(s)"}
    assert CoinRate.objects.get(coin="LTC").source == "median:kraken"


# -- providers: operator-set, peg, chained; freshness -------------------------------------------
def test_operator_rates_take_a_rate_or_a_decimal_with_its_time_and_refuse_floats():
    given = Rate(Coin.ETH, Decimal("3000.17"), "desk", NOW - timedelta(minutes=3))
    rates = StaticRates({"ETH": given, "BTC": ("90000.5", NOW)})
    assert (rates.rate(Coin.ETH), rates.rate("BTC")) == (given, Rate(Coin.BTC, Decimal("90000.5"), "operator", NOW))
    with pytest.raises(TypeError):
        StaticRates({"BTC": (90000.5, NOW)})
    with pytest.raises(RateUnavailable) as missing:
        rates.rate(Coin.LTC)
    assert str(missing.value) == "LTC"


def test_a_peg_is_dated_now_in_utc_and_only_for_stablecoins():
    before = datetime.now(UTC)
    rate = PegRates().rate(Coin.USDT)
    after = datetime.now(UTC)
    assert (rate.coin, rate.usd_per_coin, rate.source) == (Coin.USDT, Decimal(1), "peg")
    assert before <= rate.at <= after and rate.at.utcoffset() == timedelta(0)
    assert PegRates({"USDC": "0.999"}, clock=lambda: NOW).rate("USDC") == Rate(Coin.USDC, Decimal("0.999"), "peg", NOW)
    with pytest.raises(RateUnavailable) as refused:
        PegRates().rate(Coin.BTC)
    assert str(refused.value) == "BTC"


def test_chained_rates_name_the_coin_none_of_them_prices():
    rates = ChainedRates(PegRates(clock=lambda: NOW), StaticRates({"BTC": ("90000", NOW)}))
    assert rates.rate(Coin.BTC).usd_per_coin == 90000 and rates.rate(Coin.USDT).source == "peg"
    with pytest.raises(RateUnavailable) as refused:
        rates.rate(Coin.XMR)
    assert str(refused.value) == "XMR"


def test_require_fresh_uses_the_given_max_age_and_says_which_rate_is_stale():
    rate = Rate(Coin.BTC, Decimal("90000"), "operator", NOW - timedelta(minutes=20))
    assert require_fresh(rate, NOW, max_age=timedelta(minutes=30)) is rate
    with pytest.raises(StaleRateError) as stale:
        require_fresh(rate, NOW, max_age=timedelta(minutes=10))
    assert str(stale.value) == "BTC rate from operator at 2026-01-01T11:40:00+00:00 is stale at 2026-01-01T12:00:00+00:00"

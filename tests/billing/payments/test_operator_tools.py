"""Operators: coin_addresses (compare with the wallet), watch_payments, the watch task with a
node down, and the admin screens for rates, wallets, quotes and payments."""
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing.models import CoinRate, CoinWallet, JobRun, Quote
from billing.payments import config as coins_config
from billing.payments.coins.base import Coin, ScanResult
from billing.payments.services import quote_create
from billing.tasks import watch_payments
from inventory.models import AuditEntry
from tests.billing.payments_helpers import apply, offline_adapters, paid, set_rate
from tests.factories import order

# BIP84 test vector account (zpub of "abandon ... about"): first receive addresses
ZPUB = ("zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2o"
        "z2AGutZYs")


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_coin_addresses_prints_bip84_vectors(settings):
    settings.BTC_XPUB = ZPUB
    assert run("coin_addresses", "btc", "--count", "2").splitlines() == [
        "0 bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu",
        "1 bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g",
    ]


def test_coin_addresses_errors_are_clear(settings):
    with pytest.raises(CommandError, match="LTC is not configured: set LTC_XPUB"):
        run("coin_addresses", "LTC")
    with pytest.raises(CommandError, match="USDT is not configured: set ETH_XPUB and USDT_CONTRACT"):
        run("coin_addresses", "USDT")
    with pytest.raises(CommandError, match="Unknown coin"):
        run("coin_addresses", "DOGE")
    with pytest.raises(CommandError, match="Solana Pay reference"):
        run("coin_addresses", "SOL")
    settings.LTC_XPUB = "xprv9s21ZrQH143K3QTDL4LXw2F7HEK3wJUD2nW2nRk4stbPy6cq3jPPqjiChkVvvNKmPGJxWUtg6LnF5kejMRNNU3TGtRBeJgk33yuGBxrMPHi"
    with pytest.raises(CommandError, match="PRIVATE"):
        run("coin_addresses", "LTC")


class DownAdapter:
    coin, required_confirmations = Coin.BTC, 2

    def scan(self, watch, cursor):
        raise ConnectionRefusedError("node down")


class EmptyAdapter:
    coin, required_confirmations = Coin.LTC, 6

    def scan(self, watch, cursor):
        return ScanResult([], {"height": 7}, [])


def test_watch_task_reports_a_down_node_and_runs_the_others(db):
    with coins_config.use_adapters({Coin.BTC: DownAdapter(), Coin.LTC: EmptyAdapter()}):
        result = watch_payments()
        out = run("watch_payments", "--once", "--coin", "ltc")
        with pytest.raises(CommandError, match="Not configured.*XMR"):
            run("watch_payments", "--once", "--coin", "XMR")
    assert result["LTC"] == 0 and "node down" in result["BTC"]
    assert JobRun.objects.get(name="watch_payments").last_result == {"LTC": 0}
    assert out.strip() == "LTC: 0 quote(s) updated"


def test_admin_screens(client, operator, catalog, customer):
    now = timezone.now()
    client.force_login(operator)
    resp = client.post("/admin/billing/coinrate/add/", {"coin": "LTC", "usd_per_coin": "101.5", "source": "operator"})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    rate = CoinRate.objects.get()
    assert rate.usd_per_coin == 101.5 and abs(rate.set_at - timezone.now()) < timedelta(seconds=5)
    assert AuditEntry.objects.filter(action="coin_rate_set").count() == 1
    set_rate("LTC", "100", now)
    with coins_config.use_adapters(offline_adapters()):
        quote = quote_create(invoice=order(customer, now, pay=False)[1], coin="LTC", now=now)
        apply(quote, [paid(quote, 1000, 3)], now)
    CoinWallet.objects.filter(coin="LTC").update(next_index=40)
    pages = ["/admin/billing/quote/", "/admin/billing/quote/?state=processing&exception=paid_partial",
             f"/admin/billing/quote/{quote.pk}/change/", "/admin/billing/payment/", "/admin/billing/coinwallet/",
             "/admin/billing/watchercursor/", "/admin/billing/coinrate/", "/admin/billing/latepaymentclaim/",
             "/admin/billing/paymentreview/"]
    for url in pages:
        assert client.get(url).status_code == 200, url
    assert b"raise your wallet" in client.get("/admin/billing/coinwallet/").content
    detail = client.get(f"/admin/billing/quote/{quote.pk}/change/").content.decode()
    assert "0.00001" in detail and "3" in detail
    assert Quote.objects.get().state == Quote.State.PROCESSING

"""Generated chain histories: a Hypothesis state machine drives real regtest chains (litecoind,
anvil with an ERC-20 as USDT) through random sequences of quotes, payments (exact, under,
over, split over transactions, two coins for one order), replacements with another amount
or a double-spend, blocks, reorgs from one block to past the confirmation depth (the EVM one
re-mining the payments elsewhere or dropping them), operator credits of reviews, a watcher
killed between applying a pass and saving its cursor, two watchers applying passes from the
same cursor, the LTC rate moving (halving or doubling between $100 and $200), refunds to the
balance (the customer's "Cancel and refund", an operator's part refund) before or after a reorg
takes their payment, and time passing past the windows.

After every step where the watchers have caught up with the chains it checks:

* no cent created: what the store gave the customer (invoices paid less what was refunded,
  balance, money held in reviews an operator sees) is at most what the chains hold for them
  (mined or in a mempool), each payment valued at the rate the store used for it;
* that rate is the right one: a payment that paid its invoice, or was first seen while its
  quote's rate was locked (before the quote expired or settled), at the quote's rate; any
  other at a rate in effect since it was first seen, never an older one (a late payment
  is not a free option on the price);
* no invoice paid twice (an invoice is paid once, and a second quote's money is on the
  balance, which the first invariant counts);
* no GPU held past its window: an open order's hold ends by its own window, its quotes'
  expiries, or the monitoring window of a payment still confirming (in a mempool, or mined
  with fewer confirmations than its quote needs).

At the end of each history (and whenever a rule settles everything) every payment is mined
deep and the watchers run: then the store holds exactly what the chains hold — nothing kept
without a review an operator sees.

CI runs CHAIN_HISTORIES fixed sequences (default 40 of up to 20 steps, about a minute); ``make chain-histories N=2000``
runs thousands. A failing sequence is shrunk by Hypothesis and printed as a program of rule
calls: keep it as an explicit test in this module.

USDT stays at $1 and LTC at $100 or $200, so every payment is a whole number of its quote's
cents (10,000 base units at $100/LTC and $1/USDT, 5,000 at $200/LTC) and a payment valued at
the other LTC rate is rounded down, as the store rounds a credit."""
import itertools
import os
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from billing.models import CoinWallet, Invoice, Payment, PaymentReview, Quote, WatcherCursor
from billing.payments import config as coins_config
from billing.payments import services as payment_services
from billing.payments.coins.base import Coin
from billing.payments.coins.evm import EvmAdapter
from billing.payments.coins.utxo import RpcError
from billing.payments.pricing import PaymentError, cents_at
from billing.payments.services import quote_create, watch_coin
from billing.refunds import lease_refund
from billing.services import BillingError, account_for
from ops.backoffice.services import invoice_refund_to_balance
from ops.lifecycle import run_lifecycle
from tests.billing.chain_payments import CONTRACT, deploy, ltc
from tests.billing.payments.chain_histories import (
    HELD_KINDS,
    credit_first_held_review,
    held_reviews_exist,
    invoices_paid_once_and_held_no_longer,
    replay,
    watch_killed_after_applying,
)
from tests.billing.payments_helpers import eth_account_key, set_rate
from tests.factories import order

pytestmark = pytest.mark.django_db(transaction=False)

LTC_RATES = ("100", "200")  # USD per LTC; USDT stays at $1
EVM_CONFIRMATIONS = 3
LTC_CONFIRMATIONS = 2  # PAYMENT_SPEED_POLICY below: a $65 order settles at 2
_indexes = itertools.count(40_000, 100)  # each history's own addresses (the chains outlive it)
RULES: dict[str, int] = {}  # how often each rule ran (the report)
FIGURES = {"histories": 0, "steps": 0, "checks": 0, "settled_checks": 0, "lost_cents": 0}


class ChainHistories(RuleBasedStateMachine):
    # set by the test: the chains, the token, the customer and the operator
    node = w3 = token = customer = operator = None

    def __init__(self):
        super().__init__()
        self.atomic = transaction.atomic()
        self.atomic.__enter__()  # each history's rows go at its end; the chains keep theirs
        self.now = timezone.now()
        set_rate("LTC", LTC_RATES[0], self.now)
        set_rate("USDT", "1", self.now)
        self.ltc_rates = [(self.now, Decimal(LTC_RATES[0]))]  # (from when, USD per LTC), in order
        first = next(_indexes)
        CoinWallet.objects.create(coin="LTC", next_index=first, highest_paid_index=first - 1)
        CoinWallet.objects.create(coin="ETH", next_index=first, highest_paid_index=first - 1)
        self.node.mine(1)  # what earlier histories left in the mempool is mined, out of the way
        self.ltc_floor = self.node.rpc.call("getblockcount")
        self.evm_floor = self.w3.eth.block_number
        self.adapters = {Coin.LTC: ltc(self.node),
                         Coin.USDT: EvmAdapter(Coin.USDT, eth_account_key(), w3=self.w3, chain_id=31337,
                                               token=self.token.address,
                                               required_confirmations=EVM_CONFIRMATIONS)}
        self.use = coins_config.use_adapters(self.adapters)
        self.use.__enter__()
        self.quotes: list[Quote] = []
        self.sent: list[dict] = []  # every payment transaction this history made
        self.dirty = False  # a chain moved since the watchers last ran
        self.watch_all()
        FIGURES["histories"] += 1

    def teardown(self):
        try:
            self.settle_everything()
        finally:
            self.use.__exit__(None, None, None)
            transaction.set_rollback(True)
            self.atomic.__exit__(None, None, None)

    # --- the chains ---------------------------------------------------------------------

    def watch_all(self, coins=("LTC", "USDT")):
        for c in coins:
            watch_coin(coin=c, now=self.now)
        self.dirty = False

    def _ltc_tx_state(self, txid: str) -> int:
        """Confirmations as the funder wallet sees them: < 0 conflicted (gone), 0 mempool."""
        return int(self.node.wallet.call("gettransaction", txid)["confirmations"])

    def _evm_tx_state(self, txid: str) -> int:
        try:
            tx = self.w3.eth.get_transaction(txid)
        except Exception:  # dropped by a reorg
            return -1
        if tx["blockNumber"] is None:
            return 0
        return self.w3.eth.block_number - tx["blockNumber"] + 1

    def chain_cents(self, *, live_only: bool) -> int:
        """What the chains hold for the customer: every payment mined or in a mempool
        (``live_only``), else only those mined in the best chain; each at the rate the store
        used for it (``rates_used_are_the_right_ones`` checks that rate), or its quote's."""
        total = 0
        for s in self.sent:
            confs = (self._ltc_tx_state if s["coin"] == "LTC" else self._evm_tx_state)(s["txid"])
            if confs > 0 or (live_only and confs == 0):
                row = Payment.objects.filter(coin=s["coin"], txid=s["txid"], address=s["address"]).first()
                rate = row.credit_rate if row is not None and not row.in_settlement and row.credit_rate else None
                total += cents_at(s["units"], rate or s["quote_rate"], s["coin"])
        return total

    def store_cents(self) -> int:
        """What the store gave the customer: invoices paid less what was refunded (to the
        balance), the balance, money in reviews (what is proposed, else at the quote's rate)."""
        paid = sum(a - r for a, r in Invoice.objects.filter(customer=self.customer, state=Invoice.State.PAID)
                   .values_list("amount_cents", "refunded_cents"))
        held = sum(r.proposed_cents if r.proposed_cents is not None
                   else cents_at(int(r.amount), r.quote.rate_usd_per_coin, r.quote.coin)
                   for r in PaymentReview.objects.filter(state=PaymentReview.State.OPEN, kind__in=HELD_KINDS)
                   .select_related("quote"))
        return paid + account_for(self.customer).balance_cents + held

    # --- rules ----------------------------------------------------------------------------

    @precondition(lambda self: len(self.quotes) < 4)
    @rule(coin=st.sampled_from(["LTC", "USDT"]), second=st.sampled_from([None, "LTC", "USDT"]))
    def quote(self, coin, second):
        """An order and its quote; sometimes a quote in a second coin for the same order."""
        RULES['quote'] = RULES.get('quote', 0) + 1
        try:
            _, invoice = order(self.customer, self.now, pay=False)
        except Exception as exc:  # the store refuses more unpaid orders: fine, nothing happens
            FIGURES["orders_refused"] = FIGURES.get("orders_refused", 0) + 1
            FIGURES["last_refusal"] = repr(exc)[:100]
            return
        try:
            self.quotes.append(quote_create(invoice=invoice, coin=coin, now=self.now))
        except PaymentError:  # refused with a message (a watcher lagging the clock): nothing quoted
            return
        if second and second != coin:
            try:
                self.quotes.append(quote_create(invoice=invoice, coin=second, now=self.now))
            except PaymentError:
                pass

    @initialize()
    def two_orders(self):
        """Every history starts with an LTC order and a USDT order waiting to be paid."""
        self.quote("LTC", None)
        self.quote("USDT", None)

    @precondition(lambda self: self.quotes)
    @rule(data=st.data())
    def pay_exact(self, data):
        self._pay(data, "exact")

    @precondition(lambda self: self.quotes)
    @rule(data=st.data())
    def pay_under(self, data):
        self._pay(data, "under")

    @precondition(lambda self: self.quotes)
    @rule(data=st.data())
    def pay_over(self, data):
        self._pay(data, "over")

    @precondition(lambda self: self.quotes)
    @rule(data=st.data())
    def pay_split(self, data):
        """Over two transactions."""
        self._pay(data, "split")

    def _pay(self, data, how):
        RULES['pay'] = RULES.get('pay', 0) + 1
        q = data.draw(st.sampled_from(self.quotes))
        cents = int(q.amount) // _cent(q)
        parts = {"exact": [cents], "under": [cents // 2], "over": [cents + cents // 3],
                 "split": [cents // 3, cents - cents // 3]}[how]
        for part in parts:
            self._send(q, part * _cent(q))
        self.dirty = True

    def _send(self, q: Quote, units: int):
        sent = {"coin": q.coin, "units": units, "address": q.address, "quote_rate": q.rate_usd_per_coin,
                "cent": _cent(q)}
        if q.coin == "LTC":
            txid, coin = _rbf_send(self.node, q.address, Decimal(units) / 10**8)
            self.sent.append({**sent, "txid": txid, "coin_in": coin})
        else:
            tx = self.token.functions.transfer(q.address, units).transact({"from": self.w3.eth.accounts[0]})
            # After a reorg dropped a transfer, the payer's nonce is free again: the same
            # transfer sent again is the same transaction (same hash), held once by the chain.
            if not any(s["txid"] == tx.to_0x_hex() for s in self.sent):
                self.sent.append({**sent, "txid": tx.to_0x_hex()})

    @precondition(lambda self: any(s["coin"] == "LTC" and s.get("coin_in") for s in self.sent))
    @rule(data=st.data(), to=st.sampled_from(["another amount", "back to the payer"]))
    def replace(self, data, to):
        """An unconfirmed LTC payment is replaced (BIP125): another amount, or a double-spend."""
        RULES['replace'] = RULES.get('replace', 0) + 1
        s = data.draw(st.sampled_from([s for s in self.sent if s["coin"] == "LTC" and s.get("coin_in")]))
        if self._ltc_tx_state(s["txid"]) != 0:
            return
        coin = s["coin_in"]
        w = self.node.wallet
        fee = Decimal("0.001")
        if to == "another amount":
            units = max(s["units"] // 2 // s["cent"], 1) * s["cent"]
            outs = {s["address"]: Decimal(units) / 10**8,
                    w.call("getrawchangeaddress", "bech32"): coin["amount"] - Decimal(units) / 10**8 - fee}
        else:
            units, outs = 0, {w.call("getnewaddress"): coin["amount"] - fee}
        raw = w.call("createrawtransaction", [{"txid": coin["txid"], "vout": coin["vout"], "sequence": 0xFFFFFFFD}],
                     outs)
        try:
            txid = w.call("sendrawtransaction", w.call("signrawtransactionwithwallet", raw)["hex"])
        except RpcError:  # the node refuses it (the coin was replaced already at this fee): nothing sent
            return
        if units:
            self.sent.append({**s, "txid": txid, "units": units})
        self.dirty = True

    @rule(ltc_blocks=st.integers(0, 3), evm_blocks=st.integers(0, 4))
    def mine(self, ltc_blocks, evm_blocks):
        RULES['mine'] = RULES.get('mine', 0) + 1
        if ltc_blocks:
            self.node.mine(ltc_blocks)
        if evm_blocks:
            self.w3.provider.make_request("anvil_mine", [evm_blocks])
        self.dirty = True

    @rule(depth=st.integers(1, LTC_CONFIRMATIONS + 2), double_spend=st.booleans())
    def reorg_ltc(self, depth, double_spend):
        """A reorg of 1 to past the confirmation depth; its payments go back to the mempool,
        and maybe one of them is double-spent before the new chain mines them."""
        RULES['reorg_ltc'] = RULES.get('reorg_ltc', 0) + 1
        tip = self.node.rpc.call("getblockcount")
        depth = min(depth, tip - self.ltc_floor)
        if depth <= 0:
            return
        self.node.rpc.call("invalidateblock", self.node.rpc.call("getblockhash", tip - depth + 1))
        if double_spend:
            for s in self.sent:
                if s["coin"] == "LTC" and s.get("coin_in") and self._ltc_tx_state(s["txid"]) == 0:
                    _steal_back(self.node, s["coin_in"])
                    break
        self.node.mine(depth + 1, fresh=True)
        self.dirty = True

    @rule(depth=st.integers(1, EVM_CONFIRMATIONS + 2), re_mine=st.booleans())
    def reorg_evm(self, depth, re_mine):
        """anvil: the last ``depth`` blocks replaced; their payments re-mined in the new
        blocks, or left out (dropped)."""
        RULES['reorg_evm'] = RULES.get('reorg_evm', 0) + 1
        tip = self.w3.eth.block_number
        depth = min(depth, tip - self.evm_floor)
        if depth <= 0:
            return
        again = []
        if re_mine:
            for s in self.sent:
                if s["coin"] == "USDT":
                    tx = self.w3.eth.get_transaction(s["txid"]) if self._evm_tx_state(s["txid"]) > 0 else None
                    if tx is not None and tx["blockNumber"] > tip - depth:
                        raw = self.w3.provider.make_request("eth_getRawTransactionByHash", [s["txid"]])["result"]
                        again.append([raw, 0])
        reply = self.w3.provider.make_request("anvil_reorg", [depth, again])
        assert "error" not in reply, reply
        self.dirty = True

    @rule()
    def watch(self):
        RULES['watch'] = RULES.get('watch', 0) + 1
        self.watch_all()

    @rule(coin=st.sampled_from(["LTC", "USDT"]))
    def watcher_killed_after_applying(self, coin):
        """SIGKILL between the apply and the cursor save; the watcher restarts at once."""
        RULES['watcher_killed_after_applying'] = RULES.get('watcher_killed_after_applying', 0) + 1
        watch_killed_after_applying(coin, self.now)
        self.watch_all()

    @rule(coin=st.sampled_from(["LTC", "USDT"]))
    def two_watchers(self, coin):
        """Two watcher processes read the same cursor, scan, and apply one after the other."""
        RULES['two_watchers'] = RULES.get('two_watchers', 0) + 1
        cursor = WatcherCursor.objects.get(coin=coin).cursor
        watch = payment_services.watch_set(Coin(coin), self.now)
        scans = [self.adapters[Coin(coin)].scan(watch, dict(cursor)) for _ in range(2)]
        for scan in scans:
            payment_services.payments_apply_scan(coin=coin, scan=scan, now=self.now)
            WatcherCursor.objects.filter(coin=coin).update(cursor=scan.cursor)
        self.watch_all()

    @rule(minutes=st.sampled_from([1, 10, 45, 400]))
    def time_passes(self, minutes):
        """The clock moves (past quote windows, the monitoring window); watchers, then the sweeps."""
        RULES['time_passes'] = RULES.get('time_passes', 0) + 1
        self.now += timedelta(minutes=minutes)
        self.watch_all()
        run_lifecycle(self.now)

    @rule(to=st.sampled_from(LTC_RATES))
    def ltc_rate_moves(self, to):
        """The operator's LTC rate halves or doubles: new quotes, and payments valued when
        they confirm (late ones), use it; what was quoted keeps its rate."""
        RULES['ltc_rate_moves'] = RULES.get('ltc_rate_moves', 0) + 1
        self.now += timedelta(seconds=1)  # after every payment seen so far, in the store's time
        set_rate("LTC", to, self.now)
        self.ltc_rates.append((self.now, Decimal(to)))
        self.watch_all()

    @rule(data=st.data(), by=st.sampled_from(["customer cancels", "operator refunds a part"]))
    def refund(self, data, by):
        """A paid order refunded to the balance: the customer's "Cancel and refund" (within
        its window), or an operator's refund of a part of it."""
        paid = list(Invoice.objects.filter(customer=self.customer, state=Invoice.State.PAID).order_by("pk"))
        if not paid:
            return
        RULES['refund'] = RULES.get('refund', 0) + 1
        invoice = data.draw(st.sampled_from(paid))
        try:
            if by == "customer cancels":
                lease_refund(lease=invoice.lease, actor=self.customer, now=self.now)
            else:
                invoice_refund_to_balance(invoice=invoice, actor=self.operator, reason="goodwill", now=self.now,
                                          cents=max(invoice.amount_cents // 3, 1))
        except BillingError:  # past the window, refunded already: refused with a message
            FIGURES["refunds_refused"] = FIGURES.get("refunds_refused", 0) + 1

    @precondition(lambda self: held_reviews_exist())
    @rule()
    def operator_credits_a_review(self):
        RULES['operator_credits_a_review'] = RULES.get('operator_credits_a_review', 0) + 1
        credit_first_held_review(self.operator, self.now)

    @rule()
    def settle_everything(self):
        """Every payment mined deep, every quote past its window, the watchers caught up and
        the sweeps run: the store holds what the chains do."""
        RULES['settle_everything'] = RULES.get('settle_everything', 0) + 1
        self.node.mine(LTC_CONFIRMATIONS + 1)
        self.w3.provider.make_request("anvil_mine", [EVM_CONFIRMATIONS + 1])
        self.watch_all()
        self.watch_all()
        ends = [q.expires_at for q in Quote.objects.filter(pk__in=[q.pk for q in self.quotes])]
        self.now = max([self.now, *ends]) + timedelta(minutes=1)  # partly paid quotes credit at expiry
        self.watch_all()
        run_lifecycle(self.now)
        self.watch_all()
        chain, store = self.chain_cents(live_only=False), self.store_cents()
        FIGURES["settled_checks"] += 1
        FIGURES["lost_cents"] += abs(chain - store)
        assert store == chain, f"settled: the store holds {store} cents, the chains {chain}: {self._payments()}"

    # --- invariants after every step -----------------------------------------------------

    @invariant()
    def nothing_created_no_invoice_twice_no_gpu_held_too_long(self):
        FIGURES["steps"] += 1
        if self.dirty:
            return  # the watchers have not seen the chains' last move yet
        FIGURES["checks"] += 1
        store, live = self.store_cents(), self.chain_cents(live_only=True)
        assert store <= live, f"the store gave {store} cents for {live} on the chains"
        invoices_paid_once_and_held_no_longer(self.customer, self._on_a_chain_or_in_a_mempool)

    @invariant()
    def rates_used_are_the_right_ones(self):
        """Every payment credited (or proposed for credit) by itself: at its quote's rate when
        first seen while that rate was locked, else at a rate in effect since it was first
        seen. A payment counted in its invoice's settlement is worth what the invoice says."""
        for p in Payment.objects.filter(quote__invoice__customer=self.customer, credit_rate__isnull=False,
                                        in_settlement=False).select_related("quote"):
            q = p.quote
            locked_until = min(q.expires_at, q.settled_at) if q.settled_at else q.expires_at
            if p.first_seen_at <= locked_until:
                assert p.credit_rate == q.rate_usd_per_coin, (p.pk, p.credit_rate, q.rate_usd_per_coin)
                continue
            history = self.ltc_rates if q.coin == "LTC" else [(self.now, Decimal(1))]
            in_effect = [r for at, r in history if at <= p.first_seen_at][-1:] or [history[0][1]]
            since = {*in_effect, *(r for at, r in history if at > p.first_seen_at)}
            assert p.credit_rate in since, (p.pk, p.first_seen_at, p.credit_rate, history)

    def _payments(self) -> list[tuple]:
        """Each payment sent, as the chain and the store see it (for a failure's message)."""
        seen = []
        for s in self.sent:
            confs = (self._ltc_tx_state if s["coin"] == "LTC" else self._evm_tx_state)(s["txid"])
            row = Payment.objects.filter(coin=s["coin"], txid=s["txid"], address=s["address"]).first()
            seen.append((s["coin"], s["txid"][:10], s["units"], confs, row and (row.state, row.quote.state,
                         row.in_settlement, row.credited_cents, [r.kind + ":" + r.state for r in row.reviews.all()])))
        return seen

    def _on_a_chain_or_in_a_mempool(self, p: Payment) -> bool:
        state = self._ltc_tx_state if p.coin == "LTC" else self._evm_tx_state
        return state(p.txid) >= 0


def _cent(q: Quote) -> int:
    """Base units of one cent at the quote's rate."""
    return int(Decimal(10) ** Coin(q.coin).decimals / (q.rate_usd_per_coin * 100))


def _rbf_send(node, address, amount):
    """A BIP125-replaceable payment from one explicit coin of the funding wallet."""
    w = node.wallet
    coins = [u for u in w.call("listunspent", 1) if u["amount"] > amount + 1]
    if not coins:
        node.mine(1)
        coins = [u for u in w.call("listunspent", 1) if u["amount"] > amount + 1]
    coin = coins[0]
    fee = Decimal("0.0001")
    outs = {address: amount, w.call("getrawchangeaddress", "bech32"): coin["amount"] - amount - fee}
    raw = w.call("createrawtransaction", [{"txid": coin["txid"], "vout": coin["vout"], "sequence": 0xFFFFFFFD}], outs)
    return w.call("sendrawtransaction", w.call("signrawtransactionwithwallet", raw)["hex"]), coin


def _steal_back(node, coin):
    w = node.wallet
    raw = w.call("createrawtransaction", [{"txid": coin["txid"], "vout": coin["vout"], "sequence": 0xFFFFFFFD}],
                 {w.call("getnewaddress"): coin["amount"] - Decimal("0.002")})
    try:
        w.call("sendrawtransaction", w.call("signrawtransactionwithwallet", raw)["hex"])
    except RpcError:  # already replaced by a higher fee: that one stands
        pass


def _histories_on(litecoind, anvil, customer, operator, settings):
    settings.PAYMENT_SPEED_POLICY = f"10000:{LTC_CONFIRMATIONS}"
    settings.MAX_OPEN_UNPAID_ORDERS = 4
    settings.RATE_MAX_AGE_MINUTES = 100_000  # a rate stays fresh until the history moves it
    settings.REFUNDS_PER_MONTH = 1_000
    ChainHistories.node, ChainHistories.w3 = litecoind, anvil
    ChainHistories.token = deploy(anvil, CONTRACT, 10**15)
    ChainHistories.customer, ChainHistories.operator = customer, operator


def test_generated_chain_histories_lose_no_money(litecoind, anvil, catalog, customer, operator, settings):
    _histories_on(litecoind, anvil, customer, operator, settings)
    n = int(os.environ.get("CHAIN_HISTORIES", "40"))
    run_state_machine_as_test(ChainHistories, settings=hsettings(
        max_examples=n, stateful_step_count=int(os.environ.get("CHAIN_HISTORY_STEPS", "20")), deadline=None,
        suppress_health_check=list(HealthCheck), derandomize=not os.environ.get("CHAIN_HISTORIES_RANDOM"),
        **({"phases": [Phase.generate]} if os.environ.get("CHAIN_HISTORIES_NO_SHRINK") else {})))
    print(f"\nchain histories: {FIGURES}\nrules: {RULES}")
    assert FIGURES["lost_cents"] == 0


# --- shrunk histories, kept as explicit programs ---------------------------------------------

class _Pick:
    """Stands in for Hypothesis's ``data`` in a replayed program: draws the first of the
    choices (the history's quotes, or the payments it sent) in ``coin``."""

    def __init__(self, machine: ChainHistories, coin: str):
        self.machine, self.coin = machine, coin

    def draw(self, strategy):
        return next(c for c in strategy.elements if (c.coin if isinstance(c, Quote) else c["coin"]) == self.coin)


def _replay(machine: ChainHistories, steps) -> None:
    replay(machine, steps, _Pick, ["nothing_created_no_invoice_twice_no_gpu_held_too_long",
                                   "rates_used_are_the_right_ones"])


def test_usdt_overpayment_held_over_the_cap_and_dropped_by_a_reorg_is_not_kept(
        litecoind, anvil, catalog, customer, operator, settings):
    """Found by a random run (ADR 0009): a USDT payment to an expired quote, over the quote's
    automatic cap, waits in an ``over_cap`` review for an operator; a 4-block anvil reorg then
    drops it (not re-mined, and the payer's later transfers wait behind its nonce). The review
    must not stay open and creditable for money no chain holds: the store held 8,666 cents
    (65 + 21.66 USD) more than the chains."""
    _histories_on(litecoind, anvil, customer, operator, settings)
    machine = ChainHistories()
    machine.two_orders()
    _replay(machine, [
        ("settle_everything",), ("pay_exact", "@LTC"), ("time_passes", 1), ("settle_everything",),
        ("pay_exact", "@LTC"), ("watch",), ("mine", 2, 0), ("pay_over", "@USDT"), ("pay_under", "@LTC"),
        ("pay_under", "@USDT"), ("two_watchers", "LTC"), ("mine", 1, 4), ("time_passes", 1),
        ("two_watchers", "LTC"), ("pay_under", "@USDT"), ("pay_exact", "@USDT"), ("reorg_evm", 4, False),
        ("pay_split", "@LTC"),
    ])


def test_a_split_payment_whose_part_is_double_spent_holds_no_gpu_for_the_monitoring_window(
        litecoind, anvil, catalog, customer, operator, settings):
    """Found by a random run: an LTC order paid in two parts, the first part double-spent
    back to the payer before it was mined (the second is mined). The store must see the first
    part gone once the chain mined its conflict, and not hold the order's GPU for the whole
    monitoring window on its account."""
    _histories_on(litecoind, anvil, customer, operator, settings)
    machine = ChainHistories()
    machine.two_orders()
    _replay(machine, [
        ("ltc_rate_moves", "100"), ("pay_split", "@LTC"), ("quote", "LTC", "USDT"), ("ltc_rate_moves", "100"),
        ("replace", "@LTC", "back to the payer"), ("ltc_rate_moves", "100"), ("mine", 2, 1),
        ("pay_split", "@USDT"), ("ltc_rate_moves", "100"),
    ])

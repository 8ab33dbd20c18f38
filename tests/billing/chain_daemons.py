"""Session fixtures for the chain tests: a real litecoind regtest node, a real anvil chain,
a real monerod with its wallets.

They are started once per session (per xdist worker) on free ports with temp datadirs, and
registered for all of tests/billing by its conftest.py. A test module must not import them
itself: pytest then makes the module its own copy of the "session" fixture, a second daemon
that lives until the session ends. A missing tool goes
through tests/tools.py ``require``: the test skips locally (with the reason) and FAILS
under CI=true. Run ``scripts/install-chain-tools.sh`` to get them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests import deadlines
from tests.tools import require

REPO = Path(__file__).resolve().parents[2]
CHAIN_TOOLS = REPO / ".chain-tools" / "node_modules" / ".bin"

# "abandon abandon ... about": the BIP84 / BIP44 test mnemonic (never holds real funds)
TEST_MNEMONIC = "abandon " * 11 + "about"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, proc=None):
    return deadlines.wait_for(predicate, timeout, what, alive=[proc] if proc is not None else (),
                              ignore=(Exception,))


def stop(proc: subprocess.Popen):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LitecoinNode:
    def __init__(self, rpc, wallet_rpc, datadir):
        self.rpc = rpc            # node-level CoreRpc (what the watcher uses: no wallet)
        self.wallet = wallet_rpc  # the funding wallet, to pay quotes
        self.datadir = datadir
        self.mine_to = wallet_rpc.call("getnewaddress", "", "bech32")
        self._next_index = 0

    def mine(self, n: int = 1, *, fresh: bool = False) -> list[str]:
        """Mine ``n`` blocks; ``fresh`` pays a new address so the blocks differ from any
        invalidated ones (a re-mined identical block would be rejected as invalid)."""
        to = self.wallet.call("getnewaddress", "", "bech32") if fresh else self.mine_to
        return self.rpc.call("generatetoaddress", n, to)

    def fresh_indexes(self, n: int) -> list[int]:
        out = list(range(self._next_index, self._next_index + n))
        self._next_index += n
        return out


@pytest.fixture(scope="session")
def litecoind(tmp_path_factory):
    exe = shutil.which("litecoind")
    require(exe is not None, "litecoind not installed (scripts/install-chain-tools.sh installs Debian's litecoind)")
    from billing.payments.coins.utxo import CoreRpc

    datadir = tmp_path_factory.mktemp("litecoind")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "-regtest", f"-datadir={datadir}", "-server", f"-rpcport={port}", "-rpcbind=127.0.0.1",
         "-rpcallowip=127.0.0.1", "-listen=0", "-fallbackfee=0.0001", "-printtoconsole=0",
         "-disablewallet=0", "-dnsseed=0", "-upnp=0",
         "-mempoolreplacement=1",  # BIP125 as Bitcoin Core relays it (Litecoin's default is off)
         # MWEB never activates: on regtest it would from about block 432, and a block
         # invalidated after that puts its HogEx transaction (no inputs) back in the mempool,
         # where it makes every next block invalid (bad-txns-vin-empty) — the long histories
         # and deep reorgs of the money tests get there; the store takes no MWEB outputs
         "-vbparams=mweb:-2:0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        cookie = datadir / "regtest" / ".cookie"
        rpc = CoreRpc(f"http://127.0.0.1:{port}/", cookie_file=str(cookie), timeout=60)
        wait_for(lambda: rpc.call("getblockcount") >= 0, 60, "litecoind", proc)
        rpc.call("createwallet", "funder")  # legacy (non-descriptor) wallet in 0.21
        wallet = CoreRpc(f"http://127.0.0.1:{port}/wallet/funder", cookie_file=str(cookie), timeout=60)
        node = LitecoinNode(rpc, wallet, datadir)
        node.mine(101)  # mature one coinbase
        yield node
    finally:
        stop(proc)


def anvil_path() -> str | None:
    # the platform binary that the npm package ships, run directly (no node wrapper) ...
    for native in sorted((CHAIN_TOOLS.parent / "@foundry-rs").glob("anvil-*/bin/anvil")):
        if os.access(native, os.X_OK):
            return str(native)
    local = CHAIN_TOOLS / "anvil"  # ... else its node launcher
    if local.exists():
        return str(local)
    return shutil.which("anvil")


@pytest.fixture(scope="session")
def anvil():
    exe = anvil_path()
    require(exe is not None, "anvil not installed (scripts/install-chain-tools.sh: npm @foundry-rs/anvil)")
    require(not exe.startswith(str(CHAIN_TOOLS)) or shutil.which("node") is not None,
            "anvil's npm launcher needs node, which is not installed")
    from web3 import HTTPProvider, Web3

    port = free_port()
    env = dict(os.environ)
    proc = subprocess.Popen(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--chain-id", "31337", "--no-mining",
         "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )
    try:
        w3 = Web3(HTTPProvider(f"http://127.0.0.1:{port}", request_kwargs={"timeout": 30}))
        wait_for(lambda: w3.eth.block_number >= 0, 60, "anvil", proc)
        yield w3
    finally:
        stop(proc)


# The funder's wallet (monero-wallet-rpc 0.18.0, Debian 12's) picks a transfer's ring members
# in a loop that never ends in one state of a small chain: it asks for 75 candidates (ring 16
# x 1.5 + 1, plus 50 for a coinbase output), counts the outputs it may choose from one block
# further than its picker reaches, and when that block straddles the 75th output the picker
# runs out while the count says more remain (fixed upstream in 0.18.2.2, monero PR 8794).
# The wallet then spins at full CPU holding its lock, and every later call to it times out.
# Reproduced: 75 blocks mined, three transfers a block, the fourth block's transfer hangs.
# So the session's chain starts with more unlocked outputs than the picker ever asks for, and
# no reorg goes below that start: the count only grows from there.
RING_CANDIDATES = 75
SPENDABLE_AGE = 10  # blocks before an output may be a ring member (CRYPTONOTE_DEFAULT_TX_SPENDABLE_AGE)


class MoneroRegtest:
    def __init__(self, daemon_url, funder, merchant, funder_address):
        self.daemon_url = daemon_url
        self.funder = funder      # full wallet with mined coins
        self.merchant = merchant  # view-only wallet (address + view key only)
        self.funder_address = funder_address
        self.floor = 0            # the height no reorg may go below (set once the chain is made)

    def height(self) -> int:
        return self._daemon("/json_rpc", {"jsonrpc": "2.0", "id": "0", "method": "get_block_count"})[
            "result"]["count"]

    def pickable_outputs(self) -> int:
        """How many RingCT outputs the wallet's decoy picker can reach now: those of every
        block but the last ``SPENDABLE_AGE + 1`` (the picker stops a block short of the
        wallet's own count, the one that loops)."""
        reply = self._daemon("/json_rpc", {
            "jsonrpc": "2.0", "id": "0", "method": "get_output_distribution",
            "params": {"amounts": [0], "cumulative": True, "from_height": 0, "binary": False}})
        cumulative = reply["result"]["distributions"][0]["distribution"]
        return cumulative[-(SPENDABLE_AGE + 1)] if len(cumulative) > SPENDABLE_AGE else 0

    def mine(self, n: int = 1):
        import json
        import urllib.request

        body = json.dumps({"jsonrpc": "2.0", "id": "0", "method": "generateblocks",
                           "params": {"amount_of_blocks": n, "wallet_address": self.funder_address}})
        with urllib.request.urlopen(urllib.request.Request(self.daemon_url, body.encode()), timeout=120) as r:
            reply = json.loads(r.read())
        assert "error" not in reply, reply
        return reply["result"]["blocks"]

    def pay(self, address: str, amount: int) -> dict:
        """The funder pays ``amount`` piconero to ``address``, from a wallet refreshed first:
        the wallets do not refresh by themselves (``auto_refresh`` is off), so the funder
        spends what the chain holds now, after any test's reorg, not what it last saw."""
        self.funder.call("refresh")
        return self.funder.call("transfer", destinations=[{"address": address, "amount": int(amount)}])

    def depth(self, tx_hash: str) -> int:
        """How many blocks deep the daemon has ``tx_hash`` (its block counts as one; 0 while in
        the pool), as the wallets count confirmations."""
        tx = self._daemon("/get_transactions", {"txs_hashes": [tx_hash]})["txs"][0]
        return 0 if tx.get("in_pool") else self.height() - int(tx["block_height"])

    def mine_until_deep(self, tx_hash: str, depth: int) -> None:
        """Mine until ``tx_hash`` is exactly ``depth`` blocks deep. A transfer the wallet has
        just handed to monerod is not always in the next block's template (it has been seen
        to go in a block later under load), so "pay, then mine ten" can leave it nine deep:
        this mines one block at a time until the transfer is mined, then the rest at once."""
        for _ in range(5):
            if self.depth(tx_hash):
                break
            self.mine(1)
        assert self.depth(tx_hash), f"{tx_hash} still in the pool after five blocks"
        missing = depth - self.depth(tx_hash)
        assert missing >= 0, f"{tx_hash} is already deeper than {depth}"
        if missing:
            self.mine(missing)

    def forget_dropped_spends(self) -> None:
        """After a reorg dropped one of the funder's transactions: the funder's outputs it
        spent are spendable again (the wallet re-asks the daemon which key images are spent),
        so the next test's transfer does not build on a spend the chain no longer has."""
        self.funder.call("refresh")
        self.funder.call("rescan_spent")

    def _daemon(self, path: str, body: dict) -> dict:
        import json
        import urllib.request

        url = self.daemon_url.rsplit("/", 1)[0] + path
        with urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode()), timeout=120) as r:
            reply = json.loads(r.read())
        assert "error" not in reply and reply.get("result", reply).get("status") == "OK", reply
        return reply

    def reorg(self, depth: int, *, without: list[str], longer_by: int = 1) -> None:
        """A reorg ``depth`` blocks deep whose new chain lacks the transactions ``without``
        (double-spent elsewhere, say; none: the new chain mines them all again): the daemon
        pops ``depth`` blocks (their transactions go back to its pool), the pool drops
        ``without``, and ``depth + longer_by`` new blocks are mined. Each wallet follows at
        its next refresh."""
        height = self.height()
        assert height - depth >= self.floor, (
            f"a reorg {depth} deep from {height} goes below the session chain's start {self.floor}: "
            "the funder's decoy picker could loop (see RING_CANDIDATES)")
        self._daemon("/pop_blocks", {"nblocks": depth})
        if without:  # flush_txpool with no txids empties the whole pool: the kept ones too
            self._daemon("/json_rpc", {"jsonrpc": "2.0", "id": "0", "method": "flush_txpool",
                                       "params": {"txids": without}})
        self.mine(depth + longer_by)
        after = self.height()
        assert after == height + longer_by, (height, after)


@pytest.fixture(scope="session")
def monero_regtest(tmp_path_factory):
    monerod, wallet_rpc = shutil.which("monerod"), shutil.which("monero-wallet-rpc")
    require(bool(monerod and wallet_rpc),
            "monerod / monero-wallet-rpc not installed (scripts/install-chain-tools.sh: Debian monero)")
    from billing.payments.coins.monero import MoneroRpcError, MoneroWalletRpc

    root = tmp_path_factory.mktemp("monero")
    daemon_log = root / "monerod.log"
    dport, p2p, zmq, fport, mport = (free_port() for _ in range(5))
    procs = []
    try:
        procs.append(subprocess.Popen(
            [monerod, "--regtest", "--offline", "--fixed-difficulty", "1", f"--data-dir={root / 'd'}",
             "--rpc-bind-ip=127.0.0.1", f"--rpc-bind-port={dport}", f"--p2p-bind-port={p2p}",
             f"--zmq-rpc-bind-port={zmq}", "--no-igd", "--non-interactive",
             # daemon.rpc's warnings name why a transaction was refused (Funder.call reads them)
             f"--log-file={daemon_log}", "--log-level=0,daemon.rpc:WARNING"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def start_wallet_rpc(port: int, wallet_dir: Path) -> subprocess.Popen:
            return subprocess.Popen(
                [wallet_rpc, f"--daemon-address=127.0.0.1:{dport}", f"--wallet-dir={wallet_dir}",
                 "--rpc-bind-ip=127.0.0.1", f"--rpc-bind-port={port}", "--disable-rpc-login",
                 "--trusted-daemon", "--non-interactive", "--log-level=0"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        class Funder(MoneroWalletRpc):
            """The tests' payer. Like a customer's wallet, it copes with a loaded machine:

            - It asks again while its wallet says "no connection to daemon": the wallet's
              check of monerod can time out, and it refuses every call until its next check.
            - Before each transfer it asks monerod which of its outputs are spent, the pool
              included (``rescan_spent``). Its wallet file can be behind the pool: a wallet
              server killed on restart loses the transfers it sent since it last saved, and
              after a reorg it still takes for spent what the chain no longer spends. Either
              way it would spend an output twice, and monerod refuses the transfer.
            - If a transfer the wallet called failed ("no connection") reached the pool all the
              same, that transfer is returned instead of paying a second time.
            - A refused transfer names monerod's reason, from its log.

            A call that times out leaves the wallet busy with it, holding its lock, so every
            later call would time out too: the wallet server is restarted on its own files
            before the timeout is raised, and only the test that met it fails. Only the tests'
            own spending wallet does all this; the store's merchant wallet is view-only."""

            def call(self, method, **params):
                if method != "transfer":
                    return self._call_again_while_unconnected(method, **params)
                self._call_again_while_unconnected("rescan_spent")
                pool_before = self.pool()
                try:
                    return self._call_again_while_unconnected(
                        "transfer", _sent_anyway=lambda: self.pool() - pool_before, **params)
                except MoneroRpcError as exc:
                    if "rejected by daemon" in str(exc):
                        raise MoneroRpcError(f"{exc}; monerod said: {refusal_in_daemon_log()}") from exc
                    raise

            def _call_again_while_unconnected(self, method, _sent_anyway=set, **params):
                deadline = deadlines.Deadline(30)
                while True:
                    try:
                        return super().call(method, **params)
                    except MoneroRpcError as exc:
                        if "no connection to daemon" not in str(exc) or deadline.expired():
                            raise
                        if sent := _sent_anyway():
                            assert len(sent) == 1, f"the pool gained {len(sent)} transactions in one transfer"
                            return {"tx_hash": sent.pop()}
                    except TimeoutError:
                        self.restart()
                        raise
                    time.sleep(0.5)

            def pool(self) -> set[str]:
                return set(net._daemon("/get_transaction_pool_hashes", {}).get("tx_hashes", []))

            def restart(self):
                stop(procs[1])
                procs[1] = self.process = start_wallet_rpc(fport, root / "funder")
                wait_for(lambda: MoneroWalletRpc.call(self, "get_version") is not None, 60,
                         "monero-wallet-rpc (restarted)", procs[1])
                for method, params in (("open_wallet", {"filename": "funder"}),
                                       ("auto_refresh", {"enable": False}), ("refresh", {})):
                    MoneroWalletRpc.call(self, method, **params)

        def refusal_in_daemon_log() -> str:
            lines = [line for line in daemon_log.read_text(errors="replace").splitlines()
                     if "[on_send_raw_tx]" in line]
            return lines[-1].split("[on_send_raw_tx]:", 1)[-1].strip() if lines else "(nothing logged)"

        wallets = []
        for port, name in ((fport, "funder"), (mport, "merchant")):
            (root / name).mkdir()
            procs.append(start_wallet_rpc(port, root / name))
            wallet = Funder if name == "funder" else MoneroWalletRpc
            wallets.append(wallet(f"http://127.0.0.1:{port}/json_rpc", timeout=120))
        funder, merchant = wallets
        funder.process = procs[1]
        for w, proc in zip(wallets, procs[1:], strict=True):
            wait_for(lambda w=w: w.call("get_version") is not None, 60, "monero-wallet-rpc", proc)
        # the merchant's keys: made in the funder's process, then only address + view key leave it
        funder.call("create_wallet", filename="merchant-full", language="English")
        m_addr = funder.call("get_address", account_index=0)["address"]
        m_view = funder.call("query_key", key_type="view_key")["key"]
        funder.call("close_wallet")
        funder.call("create_wallet", filename="funder", language="English")
        f_addr = funder.call("get_address", account_index=0)["address"]
        merchant.call("generate_from_keys", filename="merchant-view", address=m_addr, viewkey=m_view,
                      password="", restore_height=0)
        try:  # the merchant wallet must be view-only: it cannot give a spend key
            merchant.call("query_key", key_type="spend_key")
            raise AssertionError("merchant wallet is not view-only")
        except MoneroRpcError as exc:
            assert "watch-only" in str(exc)
        # No background refresh: monero-wallet-rpc refreshes every 20 s by itself, holding the
        # wallet's lock — racing the tests' own refresh, transfer and reorg calls. The tests
        # and the adapter (MoneroAdapter.scan) refresh when they need to; the setting is the
        # server's, so it holds for the wallets a test opens later (a restored merchant).
        for w in wallets:
            w.call("auto_refresh", enable=False)
        net = MoneroRegtest(f"http://127.0.0.1:{dport}/json_rpc", funder, merchant, f_addr)
        # past the 60-block coinbase lock, with ring members for ring size 16 and the decoy
        # picker's loop out of reach (one output a block while nothing is sent)
        net.mine(100)
        while net.pickable_outputs() <= RING_CANDIDATES:
            net.mine(SPENDABLE_AGE)
        net.floor = net.height()
        funder.call("refresh")
        yield net
    finally:
        for p in reversed(procs):
            stop(p)

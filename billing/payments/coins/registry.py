"""Build the adapters from a plain config dict (the lead derives it from the environment /
admin settings). A coin whose config is missing is simply not offered.

Keys (all optional):

=====================  =====================================================================
BTC_XPUB, LTC_XPUB     account key (xpub=P2PKH, ypub/Mtub=P2SH-P2WPKH, zpub=P2WPKH) or a
                       descriptor pkh(K/0/*), sh(wpkh(K/0/*)), wpkh(K/0/*); with BTC_RPC_URL
BTC_RPC_URL            Core JSON-RPC URL (``http://user:pass@host:8332/``) ...
BTC_RPC_COOKIE         ... or the node's ``.cookie`` file (same for LTC_*)
BTC_NETWORK            main (default) / test / signet / regtest (same for LTC_NETWORK)
BTC_START_HEIGHT       first block a new watcher scans (default: the block after the tip at its first pass)
ETH_XPUB               account xpub at m/44'/60'/0'; with ETH_RPC_URL and ETH_CHAIN_ID (default 1)
USDT_CONTRACT          ERC-20 contract address (needs the ETH_* settings); USDC_CONTRACT alike
MONERO_WALLET_RPC_URL  monero-wallet-rpc of the view-only wallet (``http://u:p@host:18083``)
XMR_SETTLED_WATCH_BLOCKS  blocks a settled XMR payment is still looked for (a deep reorg; default 720)
SOL_MERCHANT_ADDRESS   Solana Pay recipient; with SOL_RPC_URL
<COIN>_CONFIRMATIONS   overrides the default confirmations (BTC 2, LTC 6, ETH/ERC-20 12, XMR 10)
=====================  =====================================================================

``build_adapters(config, require_backend=False)`` also returns derivation-only BTC/LTC/ETH
adapters when only the xpub is set (for ``coin_addresses``); with ``require_backend=True``
(the checkout) a coin is offered only when it can also be watched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Coin, CoinAdapter


def _int(config: Mapping, key: str, default: int | None = None) -> int | None:
    v = config.get(key)
    return default if v in (None, "") else int(v)


def build_adapters(config: Mapping[str, Any], *, require_backend: bool = False) -> dict[Coin, CoinAdapter]:
    out: dict[Coin, Any] = {}

    for coin in (Coin.BTC, Coin.LTC):
        xpub = config.get(f"{coin}_XPUB")
        url = config.get(f"{coin}_RPC_URL")
        if not xpub or (require_backend and not url):
            continue
        from .utxo import CoreRpc, UtxoAdapter

        rpc = CoreRpc(url, cookie_file=config.get(f"{coin}_RPC_COOKIE") or None) if url else None
        out[coin] = UtxoAdapter(
            coin, xpub, network=config.get(f"{coin}_NETWORK") or "main", rpc=rpc,
            required_confirmations=_int(config, f"{coin}_CONFIRMATIONS"),
            start_height=_int(config, f"{coin}_START_HEIGHT"),
        )

    eth_xpub, eth_url = config.get("ETH_XPUB"), config.get("ETH_RPC_URL")
    if eth_xpub and (eth_url or not require_backend):
        from .evm import EvmAdapter

        w3 = None
        if eth_url:
            from web3 import HTTPProvider, Web3

            w3 = Web3(HTTPProvider(eth_url, request_kwargs={"timeout": 30}))
        chain_id = _int(config, "ETH_CHAIN_ID", 1)
        start = _int(config, "ETH_START_HEIGHT")
        tokens = {Coin.USDT: config.get("USDT_CONTRACT"), Coin.USDC: config.get("USDC_CONTRACT")}
        for coin, token in ((Coin.ETH, None), *tokens.items()):
            if coin is not Coin.ETH and not token:
                continue
            out[coin] = EvmAdapter(coin, eth_xpub, w3=w3, chain_id=chain_id, token=token,
                                   required_confirmations=_int(config, f"{coin}_CONFIRMATIONS"),
                                   start_height=start, known_tokens=tuple(t for t in tokens.values() if t))

    if config.get("MONERO_WALLET_RPC_URL"):
        from .monero import SETTLED_WATCH_BLOCKS, MoneroAdapter, MoneroWalletRpc

        out[Coin.XMR] = MoneroAdapter(MoneroWalletRpc(config["MONERO_WALLET_RPC_URL"]),
                                      required_confirmations=_int(config, "XMR_CONFIRMATIONS"),
                                      settled_watch_blocks=_int(config, "XMR_SETTLED_WATCH_BLOCKS",
                                                                SETTLED_WATCH_BLOCKS))

    merchant, sol_url = config.get("SOL_MERCHANT_ADDRESS"), config.get("SOL_RPC_URL")
    if merchant and (sol_url or not require_backend):
        from .solana import SolanaAdapter, SolanaRpc

        out[Coin.SOL] = SolanaAdapter(merchant, SolanaRpc(sol_url) if sol_url else None)
    return out

"""Watch-only receive keys for BTC and LTC: which addresses an operator's key stands for.

Two ways to say it:

* an **account-level extended public key** (depth 3), whose SLIP-132 prefix names the
  address type: ``xpub``/``tpub``/``Ltub``/``ttub`` → P2PKH (BIP44), ``ypub``/``upub``/
  ``Mtub`` → P2SH-P2WPKH (BIP49), ``zpub``/``vpub`` → P2WPKH (BIP84); receive chain ``0/i``;
* an **output descriptor** — ``pkh(KEY/0/*)``, ``sh(wpkh(KEY/0/*))``, ``wpkh(KEY/0/*)``,
  with an optional ``[fingerprint/path]`` origin and ``#checksum`` — whose function names the
  type, whatever the key's prefix (a native-SegWit wallet that exports a plain ``xpub``,
  e.g. Ledger Live, is configured as ``wpkh(xpub…/0/*)``).

Refused: private keys (the server is watch-only), multisig prefixes (``Ypub``/``Zpub``/
``Upub``/``Vpub``), a mainnet key on a test network or the reverse, and a key that names
another coin (``Ltub``/``Mtub``/``ttub`` for Bitcoin).
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from bip_utils import Base58Decoder, Base58Encoder, Bip32KeyNetVersions, Bip32Secp256k1
from bitcoin.core import Hash160
from bitcoin.segwit_addr import encode as segwit_encode

from .base import Coin


class AddressType(enum.StrEnum):
    P2PKH = "pkh"
    P2SH_P2WPKH = "sh(wpkh)"
    P2WPKH = "wpkh"


@dataclass(frozen=True)
class KeyVersion:
    mainnet: bool
    type: AddressType
    coin: Coin | None = None  # None: any coin (Litecoin wallets export Bitcoin's prefixes too)


VERSIONS: dict[bytes, KeyVersion] = {
    bytes.fromhex(h): v for h, v in [
        ("0488b21e", KeyVersion(True, AddressType.P2PKH)),                 # xpub
        ("049d7cb2", KeyVersion(True, AddressType.P2SH_P2WPKH)),           # ypub
        ("04b24746", KeyVersion(True, AddressType.P2WPKH)),                # zpub
        ("019da462", KeyVersion(True, AddressType.P2PKH, Coin.LTC)),       # Ltub
        ("01b26ef6", KeyVersion(True, AddressType.P2SH_P2WPKH, Coin.LTC)),  # Mtub
        ("043587cf", KeyVersion(False, AddressType.P2PKH)),                # tpub
        ("044a5262", KeyVersion(False, AddressType.P2SH_P2WPKH)),          # upub
        ("045f1cf6", KeyVersion(False, AddressType.P2WPKH)),               # vpub
        ("0436f6e1", KeyVersion(False, AddressType.P2PKH, Coin.LTC)),      # ttub
    ]
}
MULTISIG_VERSIONS = {bytes.fromhex(h) for h in ("0295b43f", "02aa7ed3", "024289ef", "02575483")}
PRIVATE_PREFIXES = ("xprv", "yprv", "zprv", "Yprv", "Zprv", "tprv", "uprv", "vprv", "Ltpv", "Mtpv", "ttpv")


@dataclass(frozen=True)
class Network:
    hrp: str
    mainnet: bool
    p2pkh: int  # base58 version bytes
    p2sh: int


NETWORKS: dict[Coin, dict[str, Network]] = {
    Coin.BTC: {"main": Network("bc", True, 0x00, 0x05), "test": Network("tb", False, 0x6F, 0xC4),
               "signet": Network("tb", False, 0x6F, 0xC4), "regtest": Network("bcrt", False, 0x6F, 0xC4)},
    # Litecoin encodes P2SH with its own prefixes (M… on mainnet, Q… on test networks)
    Coin.LTC: {"main": Network("ltc", True, 0x30, 0x32), "test": Network("tltc", False, 0x6F, 0x3A),
               "regtest": Network("rltc", False, 0x6F, 0x3A)},
}

_DESCRIPTOR = re.compile(r"^(?P<fn>pkh|wpkh|sh\(wpkh)\((?:\[[0-9a-fA-F]{8}(?:/\d+['h]?)*\])?"
                         r"(?P<key>[1-9A-HJ-NP-Za-km-z]{100,120})(?P<path>(?:/\d+)*)/\*\)\)?$")


@dataclass(frozen=True)
class ReceiveKey:
    """The receive chain's key (child ``i`` is address ``i``) and its address type."""

    chain: Bip32Secp256k1
    type: AddressType

    def address(self, i: int, network: Network) -> str:
        if not 0 <= i < 2**31:
            raise ValueError("index must be a non-hardened index 0 <= i < 2**31")
        return encode_address(self.chain.ChildKey(i).PublicKey().RawCompressed().ToBytes(), self.type, network)


def parse_receive_key(text: str, coin: Coin, network: Network) -> ReceiveKey:
    """An account key or a descriptor → the receive chain, checked against ``coin``/``network``."""
    text = text.strip().split("#", 1)[0]
    match = _DESCRIPTOR.match(text)
    if match:
        key, version = _extended_key(match["key"], coin, network, need_account=False)
        chain = key
        for step in filter(None, match["path"].split("/")):
            chain = chain.ChildKey(int(step))
        return ReceiveKey(chain, AddressType("sh(wpkh)" if match["fn"] == "sh(wpkh" else match["fn"]))
    if "(" in text:
        raise ValueError("unsupported descriptor: use pkh(KEY/0/*), sh(wpkh(KEY/0/*)) or wpkh(KEY/0/*)")
    key, version = _extended_key(text, coin, network, need_account=True)
    return ReceiveKey(key.ChildKey(0), version.type)


def parse_account_xpub(xpub: str, mainnet: bool | None) -> Bip32Secp256k1:
    """An account-level extended public key whatever its prefix (Ethereum: the network is
    not in the key, ``mainnet=None``)."""
    raw = _decode(xpub)
    version = VERSIONS.get(raw[:4])
    if version is None:
        raise ValueError(f"unknown or private extended key version {raw[:4].hex()}")
    if mainnet is not None:
        _check_network(version, mainnet)
    return _account(xpub.strip(), raw, need_account=True)


def _extended_key(text: str, coin: Coin, network: Network, *, need_account: bool):
    raw = _decode(text)
    if raw[:4] in MULTISIG_VERSIONS:
        raise ValueError("a multisig key (Ypub/Zpub/Upub/Vpub) was given; configure a single-signature key")
    version = VERSIONS.get(raw[:4])
    if version is None:
        raise ValueError(f"unknown or private extended key version {raw[:4].hex()}")
    if version.coin is not None and version.coin is not coin:
        raise ValueError(f"a {version.coin} key was given for {coin}")
    _check_network(version, network.mainnet)
    return _account(text.strip(), raw, need_account=need_account), version


def _decode(text: str) -> bytes:
    text = text.strip()
    if text.startswith(PRIVATE_PREFIXES):
        raise ValueError("an extended PRIVATE key was given; configure the account xpub/zpub only")
    try:
        raw = Base58Decoder.CheckDecode(text)
    except Exception as exc:
        raise ValueError(f"not a valid extended public key: {exc}") from None
    if len(raw) != 78:
        raise ValueError("not a valid extended public key (length)")
    return raw


def _check_network(version: KeyVersion, mainnet: bool) -> None:
    if version.mainnet != mainnet:
        net = "mainnet" if version.mainnet else "testnet"
        raise ValueError(f"{net} extended key given for a {'mainnet' if mainnet else 'test'} network")


def _account(text: str, raw: bytes, *, need_account: bool) -> Bip32Secp256k1:
    key = Bip32Secp256k1.FromExtendedKey(text, key_net_ver=Bip32KeyNetVersions(raw[:4], bytes.fromhex("04358394")))
    if need_account and key.Depth() != 3:
        raise ValueError(f"expected an account-level key (depth 3, m/purpose'/coin'/account'), got depth "
                         f"{key.Depth()}; or give a descriptor such as wpkh(KEY/0/*)")
    return key


def encode_address(pubkey33: bytes, kind: AddressType, network: Network) -> str:
    key_hash = Hash160(pubkey33)
    if kind is AddressType.P2WPKH:
        return segwit_encode(network.hrp, 0, key_hash)
    if kind is AddressType.P2SH_P2WPKH:
        return Base58Encoder.CheckEncode(bytes([network.p2sh]) + Hash160(b"\x00\x14" + key_hash))
    return Base58Encoder.CheckEncode(bytes([network.p2pkh]) + key_hash)

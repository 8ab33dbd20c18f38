"""`manage.py coin_addresses COIN [--count N] [--start I]`: the first receive addresses
derived from the configured watch-only key (``<COIN>_XPUB``; ETH_XPUB for USDT/USDC),
printed as ``index address`` so operators can compare them with their wallet's own."""
from django.core.management.base import BaseCommand, CommandError

from billing.payments import config as coins_config
from billing.payments.coins.base import Coin
from billing.payments.coins.registry import build_adapters


class Command(BaseCommand):
    help = "Print the first receive addresses derived from a coin's configured xpub (index address)."

    def add_arguments(self, parser):
        parser.add_argument("coin", help="BTC, LTC, ETH, USDT, USDC or XMR")
        parser.add_argument("--count", type=int, default=5)
        parser.add_argument("--start", type=int, default=0)

    def handle(self, *args, coin, count, start, **options):
        try:
            coin = Coin(coin.upper())
        except ValueError:
            raise CommandError(f"Unknown coin {coin!r}; one of {', '.join(Coin)}.") from None
        if coin is Coin.SOL:
            raise CommandError("SOL has no derived addresses: every quote pays SOL_MERCHANT_ADDRESS with a fresh "
                               "Solana Pay reference.")
        if not 1 <= count <= 1000 or start < 0:
            raise CommandError("--count is 1..1000 and --start >= 0.")
        try:
            adapter = build_adapters(coins_config.adapter_config()).get(coin)
        except ValueError as exc:
            raise CommandError(f"{coin}: the configured key is not usable: {exc}") from None
        if adapter is None:
            key = "MONERO_WALLET_RPC_URL" if coin is Coin.XMR else (
                "ETH_XPUB" + (f" and {coin}_CONTRACT" if coin in (Coin.USDT, Coin.USDC) else "")
                if coin in (Coin.ETH, Coin.USDT, Coin.USDC) else f"{coin}_XPUB")
            raise CommandError(f"{coin} is not configured: set {key} (environment or settings).")
        for i in range(start, start + count):
            self.stdout.write(f"{i} {adapter.address_for_index(i)}")

"""Fixtures of the money tests: one set of chain daemons per session, and the order fixtures
(tests/billing/order_fixtures.py)."""
from tests.billing.chain_daemons import anvil, litecoind, monero_regtest  # noqa: F401 - one set per session
from tests.billing.order_fixtures import coins, full_window_for_new_accounts, placed, t0  # noqa: F401

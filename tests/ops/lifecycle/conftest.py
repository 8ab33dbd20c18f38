"""The lifecycle pass's tests order and pay as the money tests do: their fixtures (a `t0` of now,
not tests/ops' two months back; offline coins; the standard payment window)."""
from tests.billing.order_fixtures import coins, full_window_for_new_accounts, placed, t0  # noqa: F401

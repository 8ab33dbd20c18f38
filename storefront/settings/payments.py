"""The payment rules, each a named setting defined here once and read by
billing.payments.config at call time: environment value or default. Star-imported by
storefront/settings/__init__.py, so they are Django settings like the others."""
import os

# --- Payments never lose money nor hold stock for a payment that will not come ---
# Late and extra payments are credited at the rate when they confirm; one quote credits at
# most this percentage of its USD value automatically, the rest waits for an operator.
PAYMENT_AUTO_CREDIT_MAX_PERCENT = int(os.environ.get("PAYMENT_AUTO_CREDIT_MAX_PERCENT", "100"))
# An unconfirmed payment is watched this long from its first sighting (chain time); then it
# is invalid and the order's slots are released (BTCPay's "monitoring expiration").
PAYMENT_MONITORING_MINUTES = int(os.environ.get("PAYMENT_MONITORING_MINUTES", "360"))
# A payment under this share of the quote (basis points) is dust: it never extends a hold.
PAYMENT_DUST_BPS = int(os.environ.get("PAYMENT_DUST_BPS", "100"))
# A coin is not offered while its node's best block is older than this (node behind/stuck).
PAYMENT_NODE_MAX_TIP_AGE_MINUTES = int(os.environ.get("PAYMENT_NODE_MAX_TIP_AGE_MINUTES", "120"))
# Speed policy: "<usd cents>:<confirmations>,..." — a quote worth less than the cents needs
# only that many confirmations (e.g. "10000:1,100000:3"; larger quotes need the coin's
# <COIN>_CONFIRMATIONS, which is also the most any quote needs). Empty: always the coin's.
PAYMENT_SPEED_POLICY = os.environ.get("PAYMENT_SPEED_POLICY", "")
# A quote gets at least this long even at the end of an order's window (slots held so long).
PAYMENT_QUOTE_MIN_MINUTES = int(os.environ.get("PAYMENT_QUOTE_MIN_MINUTES", "10"))
# New quotes (fresh receive addresses) one customer may ask for per hour.
QUOTES_PER_CUSTOMER_PER_HOUR = int(os.environ.get("QUOTES_PER_CUSTOMER_PER_HOUR", "20"))
# Price sources: JSON list of {"name", "url", "path"[, "time_path"]}, {coin}/{coin_lower}
# filled in; every minute the answers younger than RATE_MAX_AGE_MINUTES go through the price
# guard (billing/payments/coins/rates.py ``judge``, docs/adr/0006): a strict majority of them
# must agree within PRICE_SOURCES_TOLERANCE_BPS of their median, and the median of those
# must be less than PRICE_MAX_MOVE_BPS from the last accepted rate. PRICE_SOURCES_MIN agreeing
# sources make a rate on their own; fewer are accepted only within PRICE_MAX_MOVE_BPS of the
# last rate that many sources (or an operator) set, and a first rate needs at least two
# sources or an operator. A refused round stops quoting in the coin until a round passes or
# an operator sets the rate (a fresh hand-set rate stays). Empty: rates are set by hand only.
PRICE_SOURCES = os.environ.get("PRICE_SOURCES", "")
PRICE_SOURCES_MIN = int(os.environ.get("PRICE_SOURCES_MIN", "2"))
PRICE_SOURCES_TOLERANCE_BPS = int(os.environ.get("PRICE_SOURCES_TOLERANCE_BPS", "200"))
PRICE_MAX_MOVE_BPS = int(os.environ.get("PRICE_MAX_MOVE_BPS", "1000"))
# --- Every payment rule defined here once (billing.payments.config reads these) ---
UNDERPAYMENT_TOLERANCE_BPS = int(os.environ.get("UNDERPAYMENT_TOLERANCE_BPS", "0"))
RATE_MAX_AGE_MINUTES = int(os.environ.get("RATE_MAX_AGE_MINUTES", "15"))
PARTIAL_PAYMENT_MAX_EXTENSION_MINUTES = int(os.environ.get("PARTIAL_PAYMENT_MAX_EXTENSION_MINUTES", "120"))
# A payment first seen up to this long after its quote closed is credited by itself; a later
# one is recorded and waits for an operator (BTC, LTC and XMR watch every address they gave;
# the other coins stop watching a closed quote's address after this long).
LATE_PAYMENT_WATCH_DAYS = int(os.environ.get("LATE_PAYMENT_WATCH_DAYS", "7"))
ADDRESS_GAP_LIMIT = int(os.environ.get("ADDRESS_GAP_LIMIT", "20"))
# Never-paid receive addresses one customer may hold past a wallet's last paid one (the gap
# limit is then warned about to the operator, never a reason to refuse everybody).
ADDRESSES_UNPAID_PER_CUSTOMER = int(os.environ.get("ADDRESSES_UNPAID_PER_CUSTOMER", "5"))
# A lease whose payment was reversed on its chain keeps running this long while the
# customer's balance is negative; then it is suspended until the debt is paid.
PAYMENT_REVERSAL_GRACE_MINUTES = int(os.environ.get("PAYMENT_REVERSAL_GRACE_MINUTES", "30"))
# The expiry sweeps wait at most this long for a coin watcher that has not scanned past an
# order's deadline, so a payment the chain dates on time wins over the sweep.
PAYMENT_WATCHER_LAG_MAX_MINUTES = int(os.environ.get("PAYMENT_WATCHER_LAG_MAX_MINUTES", "360"))
# A settled Monero payment is still looked for in the view-only wallet this many blocks past
# its block (720 ≈ 24 h): one that leaves the chain in a reorg deeper than its confirmations
# is reversed like any coin's (billing.payments.reversals). Keep it within LATE_PAYMENT_WATCH_DAYS
# (settled quotes stay watched that long).
XMR_SETTLED_WATCH_BLOCKS = int(os.environ.get("XMR_SETTLED_WATCH_BLOCKS", "720"))
# The lifecycle pass checks that every active lease this far into its renewal window
# (LEASE_RENEWAL_LEAD_HOURS before its end) has exactly one renewal invoice for its next term,
# and alerts the operators otherwise: the margin lets the renewal sweep of a busy pass finish.
RENEWAL_CHECK_GRACE_MINUTES = int(os.environ.get("RENEWAL_CHECK_GRACE_MINUTES", "10"))

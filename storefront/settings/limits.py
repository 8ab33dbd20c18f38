"""Limits against stock hoarding and refund abuse, and the throttles and hold limits found by
the attack on the production-like stack. Star-imported by storefront/settings/__init__.py;
each is read from the environment with its default here."""
import os

# --- Stock hoarding and refund abuse ---
# Unpaid orders hold their GPUs: at most this many open at once per account, and an account
# that never paid anything holds them for a shorter window.
MAX_OPEN_UNPAID_ORDERS = int(os.environ.get("MAX_OPEN_UNPAID_ORDERS", "2"))
PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES = int(os.environ.get("PAYMENT_WINDOW_NEW_ACCOUNT_MINUTES", "15"))
# Sign-ups per client address (as django-axes resolves it) within the window; then 429.
SIGNUPS_PER_IP = int(os.environ.get("SIGNUPS_PER_IP", "5"))
SIGNUP_WINDOW_MINUTES = int(os.environ.get("SIGNUP_WINDOW_MINUTES", "60"))
# The spec's 1-hour no-questions refund, at most this many times per account per calendar month (UTC).
REFUNDS_PER_MONTH = int(os.environ.get("REFUNDS_PER_MONTH", "1"))
# Forgot-password attempts with a recovery code, per client address within the window.
RECOVERY_ATTEMPTS_PER_IP = int(os.environ.get("RECOVERY_ATTEMPTS_PER_IP", "10"))
RECOVERY_WINDOW_MINUTES = int(os.environ.get("RECOVERY_WINDOW_MINUTES", "15"))

# --- Throttles and hold limits found by the attack on the production-like stack ---
# Password-reset e-mails per client address and per address mailed, within the window.
PASSWORD_RESETS_PER_IP = int(os.environ.get("PASSWORD_RESETS_PER_IP", "5"))
PASSWORD_RESETS_PER_EMAIL = int(os.environ.get("PASSWORD_RESETS_PER_EMAIL", "3"))
PASSWORD_RESET_WINDOW_MINUTES = int(os.environ.get("PASSWORD_RESET_WINDOW_MINUTES", "60"))
# Password checks inside a session (password change, new recovery codes, enrolling an
# authenticator) per account within the window.
PASSWORD_CHECKS_PER_USER = int(os.environ.get("PASSWORD_CHECKS_PER_USER", "5"))
PASSWORD_CHECK_WINDOW_MINUTES = int(os.environ.get("PASSWORD_CHECK_WINDOW_MINUTES", "15"))
# Sign-up form posts per client address (valid or not: "that username exists" answers) in
# SIGNUP_WINDOW_MINUTES; SIGNUPS_PER_IP still counts the accounts made.
SIGNUP_ATTEMPTS_PER_IP = int(os.environ.get("SIGNUP_ATTEMPTS_PER_IP", "20"))
# Unpaid orders hold at most this many GPUs per account and per client address; after an
# unpaid order expires its account and address wait this long before holding GPUs again.
MAX_UNPAID_GPUS_PER_ACCOUNT = int(os.environ.get("MAX_UNPAID_GPUS_PER_ACCOUNT", "8"))
MAX_UNPAID_GPUS_PER_IP = int(os.environ.get("MAX_UNPAID_GPUS_PER_IP", "8"))
UNPAID_EXPIRY_COOLDOWN_MINUTES = int(os.environ.get("UNPAID_EXPIRY_COOLDOWN_MINUTES", "30"))
# Unpaid holds scale with a SKU's stock (billing/holds.py): one account, client address
# (IPv6: its /64) or network (these prefixes) may hold unpaid at most this share, in basis
# points, of the SKU's units free to it (rounded down, at least 1); the last
# UNPAID_HOLD_RESERVE_UNITS free units of a SKU go only to orders paid at once.
UNPAID_HOLD_MAX_SHARE_BPS = int(os.environ.get("UNPAID_HOLD_MAX_SHARE_BPS", "2500"))
UNPAID_HOLD_RESERVE_UNITS = int(os.environ.get("UNPAID_HOLD_RESERVE_UNITS", "2"))
UNPAID_HOLD_NETWORK_PREFIX_V4 = int(os.environ.get("UNPAID_HOLD_NETWORK_PREFIX_V4", "24"))
UNPAID_HOLD_NETWORK_PREFIX_V6 = int(os.environ.get("UNPAID_HOLD_NETWORK_PREFIX_V6", "48"))
# The node agents' API: enrolment attempts per client address, and requests per node
# credential, per minute.
NODE_ENROLMENTS_PER_IP_PER_MINUTE = int(os.environ.get("NODE_ENROLMENTS_PER_IP_PER_MINUTE", "10"))
NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE = int(os.environ.get("NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE", "120"))
# The customers' API (/api/v1): requests per client address (an IPv6 client is its /64)
# and per token, per minute; past either, 429 with Retry-After.
API_REQUESTS_PER_IP_PER_MINUTE = int(os.environ.get("API_REQUESTS_PER_IP_PER_MINUTE", "300"))
API_REQUESTS_PER_TOKEN_PER_MINUTE = int(os.environ.get("API_REQUESTS_PER_TOKEN_PER_MINUTE", "120"))
# A web process counts those limits in reservations of limit // this many uses of a window
# (one Redis round trip each; at least 1, which is use by use): never more than the limit in
# a window, a client refused at most about (processes x (units - 1)) uses early (ADR 0029).
API_RATE_RESERVATIONS_PER_WINDOW = int(os.environ.get("API_RATE_RESERVATIONS_PER_WINDOW", "64"))
# /api/v1/estimate (public, in sizing) counts against the API's per-address limit too.
SIZING_API_GUARD = os.environ.get("SIZING_API_GUARD", "rental.api.rate_limited")
# Every write a signed-in customer makes on the site's pages, per account per minute
# (rental/accounts/write_limits.py): 429 with Retry-After past it.
CUSTOMER_WRITES_PER_MINUTE = int(os.environ.get("CUSTOMER_WRITES_PER_MINUTE", "60"))
# An API write's Idempotency-Key (with the answer it got) is kept this long per account;
# a retry within it replays the answer instead of writing twice (rental.idempotency).
API_IDEMPOTENCY_KEY_HOURS = int(os.environ.get("API_IDEMPOTENCY_KEY_HOURS", "24"))
# An egress counter is refused when it grew more than the link allows since the last report:
# the offer's network_gbps (else NODE_LINK_GBPS) × the seconds elapsed, plus the slack.
NODE_LINK_GBPS = int(os.environ.get("NODE_LINK_GBPS", "100"))
EGRESS_SLACK_BYTES = int(os.environ.get("EGRESS_SLACK_BYTES", str(10**9)))

"""Extensions, outgoing webhooks and the notifications ledger. Star-imported by
storefront/settings/__init__.py; each is read from the environment with its default here."""
import os

from .env import env_bool, env_list

# --- Extensions, webhooks and the notifications ledger ----------------------------
# A customer may pay terms ahead ("extend") while the paid end is at most this far away.
LEASE_EXTEND_MAX_AHEAD_DAYS = int(os.environ.get("LEASE_EXTEND_MAX_AHEAD_DAYS", "93"))
# Outgoing webhook requests: the timeout of the connect and of each read, and the retry back-off
# after each failed attempt (BTCPay's: 10 s, 1 min, then 10 min six times), in seconds.
WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("WEBHOOK_TIMEOUT_SECONDS", "5"))
# An attempt's hard deadline, from name resolution to the whole response: a receiver trickling
# a byte every few seconds never times out a read, so the attempt's sockets are shut at this
# wall-clock bound whatever they are doing (rental/notifications/sending.py).
WEBHOOK_ATTEMPT_DEADLINE_SECONDS = float(os.environ.get("WEBHOOK_ATTEMPT_DEADLINE_SECONDS", "15"))
# An attempt holds its delivery this long (a lease; the lifecycle sweep frees it only after
# it expired, for a worker that died mid-attempt); longer than the deadline, so a delivery never
# has two attempts in flight. The outbound worker kills a task still running halfway between the
# two (the backstop of the deadline). `check` refuses a lease not longer than the deadline.
WEBHOOK_ATTEMPT_LEASE_SECONDS = float(os.environ.get("WEBHOOK_ATTEMPT_LEASE_SECONDS", "60"))
# Attempts in flight at once per account (the owner of the endpoints): one customer's slow
# receiver holds at most this many of the outbound worker's slots.
WEBHOOK_CONCURRENCY_PER_ACCOUNT = int(os.environ.get("WEBHOOK_CONCURRENCY_PER_ACCOUNT", "2"))
WEBHOOK_RETRY_SECONDS = [int(s) for s in env_list("WEBHOOK_RETRY_SECONDS", "10,60,600,600,600,600,600,600")]
# Webhooks never go to private, loopback or link-local addresses (SSRF). Only tests turn this
# on, for their local receiver; `check --deploy` refuses it.
WEBHOOK_ALLOW_PRIVATE_ADDRESSES = env_bool("WEBHOOK_ALLOW_PRIVATE_ADDRESSES")
# Outbound calls a customer triggers by hand ("send a test event", "redeliver"): at most this
# many per customer per window; past it the button answers 429 with Retry-After.
WEBHOOK_MANUAL_SENDS_PER_USER = int(os.environ.get("WEBHOOK_MANUAL_SENDS_PER_USER", "10"))
WEBHOOK_MANUAL_SEND_WINDOW_MINUTES = int(os.environ.get("WEBHOOK_MANUAL_SEND_WINDOW_MINUTES", "10"))
CELERY_IMPORTS = ["rental.notifications.tasks"]  # the webhook delivery task

"""Settings, all from the environment.

Embedded default (no variables): SQLite in var/, a filesystem Celery broker, DEBUG off
unless DEBUG=1. Production: DATABASE_URL (PostgreSQL), REDIS_URL, SECRET_KEY,
ALLOWED_HOSTS, DEBUG=0 — see .env.example and docker-compose.yml.
"""
import os
import secrets
from datetime import timedelta
from pathlib import Path

from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from storefront import dburl

BASE_DIR = Path(__file__).resolve().parent.parent.parent  # storefront/settings/__init__.py
VAR_DIR = Path(os.environ.get("VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

from .env import DEBUG, TESTING, env_bool, env_list  # noqa: E402

# --- Production (DEBUG=0) refuses to start half-configured ---------------------
# One line per missing variable, raised at settings import, so web, worker, beat and the
# migrate step all stop with the same message instead of, e.g., each making its own key.
PRODUCTION = not DEBUG and not TESTING


def production_config_errors(environ=os.environ) -> list[str]:
    errors = []
    if not environ.get("SECRET_KEY", "").strip():
        errors.append("SECRET_KEY is not set: give every container the same random value "
                      "(python -c 'import secrets; print(secrets.token_urlsafe(50))').")
    if not environ.get("ALLOWED_HOSTS", "").strip():
        errors.append("ALLOWED_HOSTS is not set: the public name(s) this site answers to, "
                      "comma-separated (e.g. gpus.example.com).")
    if not environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        errors.append("DATABASE_URL is not a PostgreSQL URL (postgres://user:password@host:5432/name): "
                      "production does not run on SQLite.")
    return errors


if PRODUCTION and (_errors := production_config_errors()):
    raise ImproperlyConfigured(
        "Production settings (DEBUG=0) are incomplete; for a development checkout set DEBUG=1.\n"
        + "\n".join(_errors))


def _secret_key() -> str:
    """Production passes SECRET_KEY (checked above); the embedded default keeps a random
    one in var/, created on first start and never committed."""
    if key := os.environ.get("SECRET_KEY"):
        return key
    key_file = VAR_DIR / "dev-secret-key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "axes",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "django_otp.plugins.otp_static",  # one-time recovery codes
    "sizing",
    "inventory",
    "rental",
    "billing",
    "storage",  # volumes, snapshots, object storage on Ceph (above billing's ledger, below ops)
    "ops",  # the operator's process: the lifecycle pass, the back office (above billing, below fleet)
    "fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # A database outage in a view is a 503 with Retry-After, not a 500 (storefront/middleware.py).
    "storefront.middleware.DatabaseUnavailableMiddleware",
    "storefront.middleware.NulByteGuardMiddleware",  # NUL in a query or form: 400, not a DataError
    # /agent/v1/ (signed, token-authenticated JSON) leaves here, with its own security headers.
    "fleet.middleware.AgentApiMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    # Staff enrol TOTP before anything else; whoever enrolled gives a code.
    "storefront.middleware.TwoFactorMiddleware",
    "core.headers.SecurityHeadersMiddleware",  # Permissions-Policy, no-store when signed in
    # Every signed-in customer's page write, CUSTOMER_WRITES_PER_MINUTE (many call Ceph, wallets, DNS).
    "rental.accounts.write_limits.CustomerWriteLimitMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, so that it sees failed logins from every view (django-axes requirement).
    "axes.middleware.AxesMiddleware",
]
# The demo store's 404 is the site's own page, not the debug page.
if DEBUG and not env_bool("DEBUG_TECHNICAL_404"):
    MIDDLEWARE.insert(MIDDLEWARE.index("django.contrib.messages.middleware.MessageMiddleware") + 1,
                      "storefront.middleware.FriendlyNotFoundMiddleware")

ROOT_URLCONF = "storefront.urls"
WSGI_APPLICATION = "storefront.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "inventory.context_processors.operator",
                "rental.rules.for_templates",  # the lifecycle timers, for pages that state them
            ],
            "libraries": {"parts": "core.template_parts"},
        },
    },
]

# A comma-separated host list (libpq's multi-host form) finds the primary after a failover:
# storefront/dburl.py, docs/operations/high-availability.md.
DATABASES = {
    "default": dburl.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'storefront.sqlite3'}"),
        conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL + a busy timeout let the web process and the Celery worker share the file.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
else:
    # A database that does not answer fails the request (503) or the
    # healthcheck within this many seconds instead of hanging a web worker.
    DB_CONNECT_TIMEOUT_SECONDS = int(os.environ.get("DB_CONNECT_TIMEOUT_SECONDS", "5"))
    DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = DB_CONNECT_TIMEOUT_SECONDS
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    # Fails open: with Redis down, cache reads miss and pages are built from the database.
    CACHES = {
        "default": {"BACKEND": "core.cache.FailOpenRedisCache", "LOCATION": REDIS_URL,
                    "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 1.0}}
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "rental.accounts.login_limits.UsernameLimitBackend",  # a limit per username too
    "django.contrib.auth.backends.ModelBackend",
]
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "home"

# Login throttling (django-axes): lock a username+IP pair after 5 failures for 15 min.
AXES_FAILURE_LIMIT = int(os.environ.get("AXES_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("AXES_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# And a username from any address after this many failures (rental/accounts/login_limits.py).
AXES_USERNAME_FAILURE_LIMIT = int(os.environ.get("AXES_USERNAME_FAILURE_LIMIT", "20"))
# That lock spares a browser that signed in to the account (or recovered it) before: it
# carries a signed cookie naming the account for this many days, so guesses cannot lock
# the owner out of their own browser.
LOGIN_DEVICE_DAYS = int(os.environ.get("LOGIN_DEVICE_DAYS", "180"))
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# No lock an anonymous client can renew (docs/adr/0010-*): a username past
# AXES_USERNAME_FAILURE_LIMIT is paced, one try per source (address, IPv6 /64) per this many
# seconds; the owner's first try from their own address is never refused by others' guesses.
LOGIN_PACED_SOURCE_SECONDS = int(os.environ.get("LOGIN_PACED_SOURCE_SECONDS", "60"))
AXES_LOCKOUT_CALLABLE = "rental.accounts.login_limits.lockout_response"  # 429 + Retry-After, paced or locked
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False  # tries while locked do not prolong the lock
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# Behind the reverse proxy every request comes from the proxy's address, so axes
# takes the client's address from X-Forwarded-For (django-ipware). Caddy replaces any
# X-Forwarded-For a client sends with the address it saw, so the header holds exactly one
# entry: zero proxies after the client. Behind a CDN that appends too, raise the count.
AXES_IPWARE_META_PRECEDENCE_ORDER = ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR")
AXES_IPWARE_PROXY_COUNT = int(os.environ.get("PROXIES_AFTER_CLIENT", "0"))
OTP_TOTP_ISSUER = os.environ.get("OTP_TOTP_ISSUER", "GPU Rental")

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
# The switcher's choice (django_language cookie) is kept for a year; no script reads it.
LANGUAGE_COOKIE_AGE = 365 * 24 * 3600
LANGUAGE_COOKIE_HTTPONLY = True
LANGUAGE_COOKIE_SAMESITE = "Lax"
# zh_Hans groups prices by three with commas ($12,170), as the Chinese source documents do.
FORMAT_MODULE_PATH = ["storefront.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# The image builds static files into its own read-only /app/staticfiles (scripts/build-assets.sh);
# the embedded default collects into var/.
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "staticfiles"))
if not STATIC_ROOT.exists():
    # exist_ok: two processes starting together (the image's build step and migrate) both get here
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG or TESTING
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# The console backend prints password-reset links into the web log, so it is the
# default only for development and tests; production sends by SMTP (EMAIL_HOST etc.) and
# `check --deploy` refuses the console and in-memory backends (rental/checks.py).
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend" if DEBUG or TESTING
                               else "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(os.environ.get("EMAIL_PORT", "25"))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = os.environ.get("EMAIL_USE_TLS", "0") == "1"
EMAIL_FILE_PATH = os.environ.get("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "billing@localhost")

# --- Security headers (django-csp for CSP; Django for the rest) ---
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
        "base-uri": [SELF],
        "object-src": [NONE],
    }
}
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
DATA_UPLOAD_MAX_MEMORY_SIZE = 256 * 1024
# Browser features no page here uses are off for every page.
PERMISSIONS_POLICY = ("accelerometer=(), camera=(), geolocation=(), gyroscope=(), magnetometer=(), "
                      "microphone=(), payment=(), usb=()")
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    LANGUAGE_COOKIE_SECURE = True

# --- Celery: Redis in production, a serverless filesystem broker by default ---
CELERY_TIMEZONE = "UTC"
CELERY_ENABLE_UTC = True
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-task leaves the message to be redone
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    if _visibility := int(os.environ.get("CELERY_VISIBILITY_TIMEOUT", "0")):
        # Seconds before a message whose worker died unacknowledged is delivered again
        # (Redis default: 1 hour). Keep it above the longest task; jobs are idempotent anyway.
        CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": _visibility, "unacked_restore_throttle": 1,
                                           "unacked_restore_interval": max(1, min(10, _visibility // 2))}
else:
    _broker_dir = VAR_DIR / "celery-broker"
    for sub in ("out", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "data_folder_processed": str(_broker_dir / "processed"),
        # kombu's default is ./control: broadcast files landed in whatever the cwd was
        "control_folder": str(_broker_dir / "control"),
    }
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", TESTING)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Work is isolated by kind, each kind on its own queue read by its own worker
# (scripts/start.sh worker|outbound): the jobs queue carries the lifecycle pass, the payment
# watchers and the rates; the outbound queue every call to an address a customer chose (webhook
# deliveries). A receiver that answers slowly can then fill only outbound slots, never stop the
# pass that credits payments, expires orders and releases leases. Whatever is not routed goes
# to the jobs queue. The names are settings only so that tests can run workers on queues of
# their own; the worker's node name is its queue's (the healthchecks ping it by that name).
JOBS_QUEUE = os.environ.get("JOBS_QUEUE", "jobs")
OUTBOUND_QUEUE = os.environ.get("OUTBOUND_QUEUE", "outbound")
CELERY_TASK_DEFAULT_QUEUE = JOBS_QUEUE
CELERY_TASK_ROUTES = {"billing.*": {"queue": JOBS_QUEUE}, "rental.webhook_deliver": {"queue": OUTBOUND_QUEUE}}
# --- One lifecycle pass at a time; beat heartbeat for its healthcheck ---
# Seconds between lifecycle passes (beat); a tick not started within the interval expires.
LIFECYCLE_INTERVAL_SECONDS = float(os.environ.get("LIFECYCLE_INTERVAL_SECONDS", "60"))
# A pass holds a lock (a JobLock row, on the database's clock: ops/lifecycle/locks.py) that expires this
# many seconds after its last renewal (every third of it while the pass runs): a holder
# killed mid-pass blocks the next passes for at most this long.
LIFECYCLE_LOCK_SECONDS = float(os.environ.get("LIFECYCLE_LOCK_SECONDS", "60"))
# A pass runs each sweep in batches until its due work is done or it has run this
# long (the rest is the next pass's): under the interval, so the next tick is not skipped.
LIFECYCLE_PASS_BUDGET_SECONDS = float(os.environ.get("LIFECYCLE_PASS_BUDGET_SECONDS",
                                                     str(0.8 * LIFECYCLE_INTERVAL_SECONDS)))
# Due rows a sweep handles per query and per transaction (ops.lifecycle._run_sweeps).
LIFECYCLE_BATCH = int(os.environ.get("LIFECYCLE_BATCH", "100"))
# The niceness the background processes (Celery's workers and beat: the lifecycle pass, the
# payment watchers, webhooks) run at, so that on a shared host the requests' processes take
# the CPU first (storefront/priority.py; 0 keeps the one they were started with).
JOBS_NICENESS = int(os.environ.get("JOBS_NICENESS", "10"))
# The niceness the watch process (the nodes' waits and reports) runs at: between the web's
# and the jobs', so that a customer's page takes the CPU before a node's report, which has
# seconds to spare, and the reports before a lifecycle burst (storefront/priority.py,
# scripts/start.sh watch; 0 keeps the one it was started with).
WATCH_NICENESS = int(os.environ.get("WATCH_NICENESS", "5"))
# The beat touches this file on every scheduler tick; its healthcheck fails when older than
# BEAT_HEARTBEAT_MAX_AGE_SECONDS (beat ticks at least every beat_max_loop_interval).
CELERY_BEAT_SCHEDULER = "storefront.beat:HeartbeatScheduler"
CELERY_BEAT_MAX_LOOP_INTERVAL = 30
BEAT_HEARTBEAT_FILE = VAR_DIR / "beat-heartbeat"
BEAT_HEARTBEAT_MAX_AGE_SECONDS = int(os.environ.get("BEAT_HEARTBEAT_MAX_AGE_SECONDS", "120"))
# Seconds between the payment watchers' passes (every configured coin) and between rate refreshes.
PAYMENT_WATCH_INTERVAL_SECONDS = float(os.environ.get("PAYMENT_WATCH_INTERVAL_SECONDS", "30"))
RATES_REFRESH_INTERVAL_SECONDS = float(os.environ.get("RATES_REFRESH_INTERVAL_SECONDS", "60"))
# One beat runs every periodic job; the lifecycle lock makes a duplicate beat harmless. A tick
# not started within its interval (less 5 s) expires: the next one is due by then.
CELERY_BEAT_SCHEDULE = {
    name: {"task": task, "schedule": interval, "options": {"expires": max(1.0, interval - 5)}}
    for name, task, interval in (("lifecycle", "billing.lifecycle_tick", LIFECYCLE_INTERVAL_SECONDS),
                                 ("watch_payments", "billing.watch_payments", PAYMENT_WATCH_INTERVAL_SECONDS),
                                 ("refresh_rates", "billing.refresh_rates", RATES_REFRESH_INTERVAL_SECONDS))
}
# A scheduled job is stale when its last completed pass (JobRun, written by the pass) is older
# than this many of its intervals: the jobs worker's healthcheck fails on a stale lifecycle pass
# or coin watcher (`manage.py healthcheck worker`), and the ops dashboard raises an alert.
JOB_STALE_AFTER_INTERVALS = float(os.environ.get("JOB_STALE_AFTER_INTERVALS", "3"))
# What the worker's healthcheck asks, besides a ping, whether the work is done: the jobs live in
# billing, above the command (rental), which calls this by name (billing/jobs.py).
WORKER_HEALTH_CHECK = "billing.jobs.stale_jobs"
PAYMENT_WINDOW_MINUTES = int(os.environ.get("PAYMENT_WINDOW_MINUTES", "30"))
# --- The node agent (fleet/, nodeagent/PROTOCOL.md) ---
# A real deployment drives its GPU servers through the node agent; FakeAgent, which
# creates nothing, only for the demo (`make run`, DEBUG=1) and tests, and says so in the admin.
HOST_AGENT = os.environ.get("HOST_AGENT", "rental.agent.FakeAgent" if DEBUG or TESTING
                            else "fleet.driver.NodeAgentDriver")

# --- Lease lifecycle timers: one named setting per rule, the SPEC's defaults,
# overridable from the environment. Read through rental.rules at call time, so the
# sweeps, timeline, model properties, admin, pages and API always show and act on the
# same moments.
LEASE_REFUND_WINDOW_MINUTES = int(os.environ.get("LEASE_REFUND_WINDOW_MINUTES", "60"))
# Reminders before the term ends, in hours (SPEC: 3 days and 1 day).
LEASE_REMINDER_LEAD_HOURS = [int(h) for h in env_list("LEASE_REMINDER_LEAD_HOURS", "72,24")]
LEASE_RENEWAL_LEAD_HOURS = int(os.environ.get("LEASE_RENEWAL_LEAD_HOURS", "24"))
# Counted from the moment the instance is actually stopped (not from the term's end).
LEASE_HOLD_HOURS = int(os.environ.get("LEASE_HOLD_HOURS", "72"))
# Local NVMe wiped at the latest this long after the stop (wiped as soon as the key is gone).
LEASE_WIPE_WITHIN_DAYS = int(os.environ.get("LEASE_WIPE_WITHIN_DAYS", "7"))

# --- Stock hoarding, refund abuse, throttles and hold limits
from .limits import *  # noqa: E402,F403

# --- The payment rules, each defined once (billing.payments.config reads them)
from .payments import *  # noqa: E402,F403

HOST_AGENT_FAKE_DELAY = int(os.environ.get("HOST_AGENT_FAKE_DELAY", "180"))

# --- Node agents: enrolment, the interval, waits, heartbeats, the replay guard
from .nodes import *  # noqa: E402,F403

# A card on an enrolled node is sold only with a passing burn-in newer than its
# last lease (inventory.burnin, docs/adr/0013); the agent runs `dcgmi diag -r BURN_IN_DCGM_LEVEL`.
BURN_IN_BEFORE_SALE = os.environ.get("BURN_IN_BEFORE_SALE", "1") == "1"
BURN_IN_DCGM_LEVEL = int(os.environ.get("BURN_IN_DCGM_LEVEL", "2"))

# Sizing pages get the live catalog through this hook, keeping sizing free of imports
# from inventory (imports flow sizing <- inventory <- rental <- billing).
SIZING_CANDIDATES_PROVIDER = "inventory.selectors.sizing_candidates"

# The calculator and tables pages go through the same anonymous whole-page cache
# as the catalog (keyed on path, language and catalog generation; each visitor gets their
# own CSRF token). Empty: no page cache (the sizing memo still keeps the rendered parts).
SIZING_PAGE_CACHE = os.environ.get("SIZING_PAGE_CACHE", "inventory.pagecache.anonymous_page_cache")

# Seconds the catalog rows (stock per offer and site) are cached; every stock change bumps
# a generation, so this only bounds staleness from writes that bypass the services. Off in tests.
CATALOG_CACHE_SECONDS = int(os.environ.get("CATALOG_CACHE_SECONDS", "0" if TESTING else "10"))

# bench/load.py's baseline: a bare Django view at /bench/bare (off unless asked for).
BENCH_BASELINE_VIEW = env_bool("BENCH_BASELINE_VIEW")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {"axes": {"level": "WARNING"}},
}

# --- Who runs this store (footer, terms, privacy, invoices) -----------------------
OPERATOR_NAME = os.environ.get("OPERATOR_NAME", "GPU Rental")
OPERATOR_CONTACT = os.environ.get("OPERATOR_CONTACT", "support@localhost")
# The store's address as customers reach it, for links in e-mails (https://shop.example);
# empty: https:// and the first name in ALLOWED_HOSTS.
PUBLIC_URL = os.environ.get("PUBLIC_URL", "")
STATUS_PAGE_DAYS = int(os.environ.get("STATUS_PAGE_DAYS", "30"))
# Demo payment mode (`make run` turns it on): a "simulate payment" button settles invoices
# without money. Never in production: `check --deploy` refuses it (billing/checks.py).
DEMO_PAYMENTS = env_bool("DEMO_PAYMENTS")

# --- Extensions, webhooks and the notifications ledger
from .notifications import *  # noqa: E402,F403

# --- Storage on each site's Ceph cluster, snapshots of lease disks
from .storage import *  # noqa: E402,F403

# --- the customer's workbench: images, templates, variables, secrets, ports (rental.workbench)
from .workbench import *  # noqa: E402,F403

# teams (ADR 0017) and GPU telemetry (docs/adr/0016) are in workbench.py too
from .workbench import WORKBENCH_IDLE_CHECK_SECONDS  # noqa: E402 - named: read below

CELERY_BEAT_SCHEDULE["idle_notices"] = {"task": "fleet.idle_notices", "schedule": WORKBENCH_IDLE_CHECK_SECONDS,
                                        "options": {"expires": max(1.0, WORKBENCH_IDLE_CHECK_SECONDS - 5)}}

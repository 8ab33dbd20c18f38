"""Settings, all from the environment.

Embedded default (no variables): SQLite in var/, a filesystem Celery broker, DEBUG off
unless DEBUG=1. Production: DATABASE_URL (PostgreSQL), REDIS_URL, SECRET_KEY,
ALLOWED_HOSTS, DEBUG=0 — see .env.example and docker-compose.yml.
"""
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(int(default))).strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG")
TESTING = env_bool("TESTING")


def _secret_key() -> str:
    """Production passes SECRET_KEY (docker-compose requires it); the embedded default
    keeps a random one in var/, created on first start and never committed."""
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
    "sizing",
    "inventory",
    "rental",
    "billing",
    "fleet",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # A database outage in a view is a 503 with Retry-After, not a 500 (rental/middleware.py).
    "rental.middleware.DatabaseUnavailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "rental.middleware.AdminOTPRequiredMiddleware",  # staff with a TOTP device give a code
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, so that it sees failed logins from every view (django-axes requirement).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "rental.urls"
WSGI_APPLICATION = "rental.wsgi.application"

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
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    # Fails open: with Redis down, cache reads miss and pages are built from the database.
    CACHES = {
        "default": {"BACKEND": "rental.cache.FailOpenRedisCache", "LOCATION": REDIS_URL,
                    "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 1.0}}
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
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
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
OTP_TOTP_ISSUER = os.environ.get("OTP_TOTP_ISSUER", "GPU Rental")

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
# The switcher's choice (django_language cookie) is kept for a year; no script reads it.
LANGUAGE_COOKIE_AGE = 365 * 24 * 3600
LANGUAGE_COOKIE_HTTPONLY = True
LANGUAGE_COOKIE_SAMESITE = "Lax"
# zh_Hans groups prices by three with commas ($12,170), as the Chinese source documents do.
FORMAT_MODULE_PATH = ["rental.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG or TESTING
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
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
if not DEBUG and not TESTING:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = int(os.environ.get("SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

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
    for sub in ("out", "processed"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "data_folder_processed": str(_broker_dir / "processed"),
    }
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", TESTING)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# One beat runs every periodic job; each job is idempotent, so a duplicate beat is harmless.
CELERY_BEAT_SCHEDULE = {
    "lifecycle": {"task": "billing.lifecycle_tick", "schedule": 60.0, "options": {"expires": 55}},
    "watch_payments": {"task": "billing.watch_payments", "schedule": 30.0, "options": {"expires": 25}},
}
PAYMENT_WINDOW_MINUTES = int(os.environ.get("PAYMENT_WINDOW_MINUTES", "30"))
# --- issue 12: the node agent (fleet/, nodeagent/PROTOCOL.md) ---
# A real deployment drives its GPU servers through the node agent; FakeAgent, which
# creates nothing, only for the demo (`make run`, DEBUG=1) and tests, and says so in the admin.
HOST_AGENT = os.environ.get("HOST_AGENT", "rental.agent.FakeAgent" if DEBUG or TESTING
                            else "fleet.driver.NodeAgentDriver")
HOST_AGENT_FAKE_DELAY = int(os.environ.get("HOST_AGENT_FAKE_DELAY", "180"))
# A lease still provisioning this long after payment fails: slots freed, refunded to the balance.
NODE_PROVISIONING_DEADLINE = timedelta(minutes=int(os.environ.get("NODE_PROVISIONING_DEADLINE_MINUTES", "15")))
# A node whose last report is older than this is "not reporting" in the admin and dashboard.
NODE_REPORT_STALE_AFTER = timedelta(minutes=int(os.environ.get("NODE_REPORT_STALE_AFTER_MINUTES", "3")))
NODE_ENROLMENT_CODE_TTL = timedelta(hours=int(os.environ.get("NODE_ENROLMENT_CODE_TTL_HOURS", "24")))
# Reports whose sent_at is further than this from the server's clock are refused (replays).
NODE_REPORT_MAX_SKEW = timedelta(minutes=5)
NODE_POLL_SECONDS = int(os.environ.get("NODE_POLL_SECONDS", "15"))

# Sizing pages get the live catalog through this hook, keeping sizing free of imports
# from inventory (imports flow sizing <- inventory <- rental <- billing).
SIZING_CANDIDATES_PROVIDER = "inventory.selectors.sizing_candidates"

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

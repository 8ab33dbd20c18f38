"""Settings for bench/faults.py's Celery beat and worker: production settings with the
lifecycle tick every FAULTS_TICK seconds (default 5) instead of every minute, so a bounded
run shows several ticks before, during and after an outage. Nothing else changes."""
import os

from storefront.settings import *  # noqa: F403

_tick = float(os.environ.get("FAULTS_TICK", "5"))
CELERY_BEAT_SCHEDULE = {
    "lifecycle": {"task": "billing.lifecycle_tick", "schedule": _tick, "options": {"expires": _tick - 1}},
}

"""The lifecycle's timers as durations, read from settings (storefront/settings/__init__.py, "Lease
lifecycle timers") at call time: the one place sweeps, timeline, model properties, admin,
pages and the API get them from."""
from datetime import datetime, timedelta

from django.conf import settings


def refund_window() -> timedelta:
    return timedelta(minutes=settings.LEASE_REFUND_WINDOW_MINUTES)


def renewal_lead() -> timedelta:
    return timedelta(hours=settings.LEASE_RENEWAL_LEAD_HOURS)


def hold() -> timedelta:
    return timedelta(hours=settings.LEASE_HOLD_HOURS)


def wipe_within() -> timedelta:
    return timedelta(days=settings.LEASE_WIPE_WITHIN_DAYS)


def reminder_kind(lead: timedelta) -> str:
    """'reminder_3d' for 72 h, 'reminder_1d' for 24 h, 'reminder_6h' for 6 h."""
    hours = int(lead.total_seconds() // 3600)
    return f"reminder_{hours // 24}d" if hours % 24 == 0 else f"reminder_{hours}h"


def reminders() -> list[tuple[str, timedelta]]:
    """(notification kind, lead before the term's end), the longest lead first."""
    leads = sorted({timedelta(hours=h) for h in settings.LEASE_REMINDER_LEAD_HOURS}, reverse=True)
    return [(reminder_kind(lead), lead) for lead in leads]


def held_from(*, stopped_at: datetime, ends_at: datetime) -> datetime:
    """When a hold starts: the moment the instance is stopped, but never before the paid
    term ends (an operator's mid-term suspension does not cut the paid term short)."""
    return max(stopped_at, ends_at)



def for_templates(request=None) -> dict:
    """Context processor: `lifecycle_rules.hold_hours` etc. for pages that state the rules."""
    return {"lifecycle_rules": {
        "refund_minutes": settings.LEASE_REFUND_WINDOW_MINUTES,
        "renewal_hours": settings.LEASE_RENEWAL_LEAD_HOURS,
        "hold_hours": settings.LEASE_HOLD_HOURS,
        "wipe_days": settings.LEASE_WIPE_WITHIN_DAYS,
    }}

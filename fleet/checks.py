"""Checks of the fleet's own timers (`manage.py check`): the interval a node may be told
(fleet/pacing.py) must fit in one wait and leave a live node reporting."""
from django.conf import settings
from django.core.checks import Error, register


@register()
def node_pace_fits_the_timers(app_configs, **kwargs):
    errors = []
    most, floor = settings.NODE_POLL_MAX_SECONDS, settings.NODE_POLL_SECONDS
    if most < floor:
        errors.append(Error(f"NODE_POLL_MAX_SECONDS ({most}) is below NODE_POLL_SECONDS ({floor}).",
                            hint="The largest interval a node is told must be at least the smallest.",
                            id="fleet.E001"))
    if most > settings.NODE_WATCH_MAX_SECONDS:
        errors.append(Error(f"NODE_POLL_MAX_SECONDS ({most}) is above NODE_WATCH_MAX_SECONDS "
                            f"({settings.NODE_WATCH_MAX_SECONDS}).",
                            hint="A node's report waits for the rest of its interval: a wait cut shorter makes it "
                                 "send more requests than its interval says.", id="fleet.E002"))
    # A live node's stored report is at most one heartbeat and one interval old; one more
    # interval lets it miss a round without being shown as not reporting.
    needed = settings.NODE_SEEN_WRITE_SECONDS + 2 * most
    if settings.NODE_REPORT_STALE_AFTER.total_seconds() < needed:
        errors.append(Error(f"NODE_REPORT_STALE_AFTER ({settings.NODE_REPORT_STALE_AFTER}) is shorter than "
                            f"NODE_SEEN_WRITE_SECONDS + 2 x NODE_POLL_MAX_SECONDS ({needed} s).",
                            hint="Lower NODE_POLL_MAX_SECONDS or raise NODE_REPORT_STALE_AFTER_MINUTES: live nodes "
                                 "would be shown as not reporting.", id="fleet.E003"))
    if settings.NODE_REPORTS_PER_SECOND <= 0 or settings.NODE_POLL_STEP_SECONDS <= 0:
        errors.append(Error("NODE_REPORTS_PER_SECOND and NODE_POLL_STEP_SECONDS must be positive.",
                            id="fleet.E004"))
    return errors

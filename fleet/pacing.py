"""How often a node reports: the interval every node is told (`poll_seconds`, PROTOCOL.md),
grown with the fleet so that the nodes' requests stay within what one storefront answers.

A steady node makes one request an interval (the report that waits, ADR 0028), so a fleet
sends its nodes over the interval a second. A fleet that sends at most
NODE_REPORTS_PER_SECOND at NODE_POLL_SECONDS is told NODE_POLL_SECONDS; a larger one the
interval at which it does, rounded up to NODE_POLL_STEP_SECONDS (a few nodes more or less do
not change every node's document), at most NODE_POLL_MAX_SECONDS. Nomad sizes its clients'
heartbeats the same way (`max_heartbeats_per_second`).

What the interval no longer paces (ADR 0032): a change to a node's desired state reaches it
through its wait, within about a second, and a node is judged not reporting after
NODE_REPORT_STALE_AFTER whatever its interval (fleet/checks.py keeps that above two
intervals). What it still paces: what only the node sees (an instance that exited by itself)
reaches the storefront with its next report.
"""
import math
from datetime import datetime

from django.conf import settings
from django.core.cache import cache

from .models import NodeAgent

#: The shared cache's count of reporting nodes (recounted every NODE_PACE_RECOUNT_SECONDS).
REPORTING_KEY = "fleet:reporting-nodes"


def poll_seconds_for(nodes: int) -> int:
    """The interval for a fleet of `nodes` reporting nodes."""
    floor = settings.NODE_POLL_SECONDS
    needed = nodes / settings.NODE_REPORTS_PER_SECOND
    if needed <= floor:
        return floor
    step = settings.NODE_POLL_STEP_SECONDS
    # never below the floor, even where NODE_POLL_MAX_SECONDS is (a test's long floor; the
    # check fleet.E001 refuses it in a deployment)
    return max(floor, min(settings.NODE_POLL_MAX_SECONDS, math.ceil(needed / step) * step))


def reporting_nodes(now: datetime) -> int:
    """Agents, not revoked, whose last report is younger than NODE_REPORT_STALE_AFTER: counted
    once per NODE_PACE_RECOUNT_SECONDS for every process (the shared cache), so every node's
    document is built with the same figure."""
    counted = cache.get(REPORTING_KEY)
    if counted is None:
        counted = NodeAgent.objects.filter(revoked_at__isnull=True,
                                           last_report_at__gte=now - settings.NODE_REPORT_STALE_AFTER).count()
        cache.set(REPORTING_KEY, counted, settings.NODE_PACE_RECOUNT_SECONDS)
    return counted


def poll_seconds(now: datetime) -> int:
    """The interval a node is told now (its desired document, its enrolment's answer)."""
    return poll_seconds_for(reporting_nodes(now))

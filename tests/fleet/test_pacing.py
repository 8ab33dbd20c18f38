"""The interval a node is told (fleet/pacing.py): NODE_POLL_SECONDS for a fleet that sends
within NODE_REPORTS_PER_SECOND at that pace, longer for a larger one, never past
NODE_POLL_MAX_SECONDS; told in the desired state, a report's answer and enrolment."""
from types import SimpleNamespace

import pytest
from django.core.cache import cache
from django.test import Client, override_settings
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from fleet.models import NodeAgent
from fleet.pacing import REPORTING_KEY, poll_seconds_for, reporting_nodes
from fleet.services import enrolment_code_create
from inventory.models import Node

from .conftest import FakeNode

pacings = st.builds(SimpleNamespace, floor=st.integers(1, 120), step=st.integers(1, 60),
                    extra=st.integers(0, 600), rate=st.floats(0.05, 5000, allow_nan=False))


@given(pacings, st.integers(0, 2_000_000), st.integers(0, 2_000_000))
def test_the_interval_keeps_the_fleet_within_its_rate_or_is_the_longest(pacing, nodes, more):
    with override_settings(NODE_POLL_SECONDS=pacing.floor, NODE_POLL_STEP_SECONDS=pacing.step,
                           NODE_POLL_MAX_SECONDS=pacing.floor + pacing.extra,
                           NODE_REPORTS_PER_SECOND=pacing.rate):
        interval, larger = poll_seconds_for(nodes), poll_seconds_for(nodes + more)
    longest = pacing.floor + pacing.extra
    assert pacing.floor <= interval <= longest
    # the fleet's reports a second stay within the rate, unless the interval is the longest
    assert nodes / interval <= pacing.rate or interval == longest
    # only a fleet that would send more than the rate at the floor is slowed, by whole steps
    if nodes / pacing.floor <= pacing.rate:
        assert interval == pacing.floor
    elif interval < longest:
        assert interval % pacing.step == 0
    assert larger >= interval          # more nodes never report more often


def test_the_default_fleet_sizes():
    """A 2-core storefront at its defaults (175 reports a second, docs/performance.md)."""
    assert [poll_seconds_for(n) for n in (0, 1_000, 2_625, 2_700, 5_000, 10_000, 50_000)] == \
        [15, 15, 15, 20, 30, 60, 60]


@pytest.fixture
def uncounted():
    cache.delete(REPORTING_KEY)
    yield
    cache.delete(REPORTING_KEY)


@pytest.mark.django_db
def test_a_larger_fleet_is_told_a_longer_interval_everywhere(catalog, enrol, operator, settings, uncounted):
    """At 0.1 reports a second, two reporting nodes need 20 s and three 30 s: the desired
    state, a report's answer and a new node's enrolment say so. A node enrolled but not yet
    reporting, a revoked one and one silent past NODE_REPORT_STALE_AFTER do not count."""
    settings.NODE_REPORTS_PER_SECOND = 0.1
    nodes = list(Node.objects.order_by("pk")[:6])
    fakes = [enrol(node) for node in nodes[:5]]
    for fake in (fakes[0], fakes[1], fakes[3], fakes[4]):
        assert fake.report().status_code == 200          # each has reported (last_report_at)
    NodeAgent.objects.filter(node=nodes[3]).update(revoked_at=timezone.now())
    NodeAgent.objects.filter(node=nodes[4]).update(last_report_at=timezone.now() - settings.NODE_REPORT_STALE_AFTER)
    cache.delete(REPORTING_KEY)          # counted (as none) when their documents were built
    assert reporting_nodes(timezone.now()) == 2
    assert fakes[0].desired().json()["poll_seconds"] == 20
    # counted once for NODE_PACE_RECOUNT_SECONDS: a node's first report moves nothing yet
    assert fakes[2].report().status_code == 200
    assert fakes[1].post(fakes[1].body(desired_etag="")).json()["desired"]["poll_seconds"] == 20
    cache.delete(REPORTING_KEY)          # the recount: three reporting, 30 s
    assert fakes[1].post(fakes[1].body(desired_etag="")).json()["desired"]["poll_seconds"] == 30
    joining = FakeNode(nodes[5], Client())
    assert joining.enrol(enrolment_code_create(node=nodes[5], actor=operator, now=timezone.now())
                         ).json()["poll_seconds"] == 30


@pytest.mark.django_db
def test_a_small_fleet_is_told_the_floor(catalog, enrol, settings, uncounted):
    fake = enrol(Node.objects.order_by("pk").first())
    assert fake.report().status_code == 200
    assert fake.desired().json()["poll_seconds"] == settings.NODE_POLL_SECONDS == 15

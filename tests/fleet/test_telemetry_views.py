"""What the customer sees of the telemetry: the lease page's charts (inline SVG, no
JavaScript), the term's egress against its allowance and the GPU errors; the metrics API
with its range and resolution, and its bad input as 400s."""
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.egress import egress_record
from fleet.telemetry import Parsed, store
from inventory.models import SlotAllocation
from rental.accounts.services import api_token_create
from tests.otp import TwoFactorClient as Client

from .conftest import node_of, ready

pytestmark = pytest.mark.django_db


@pytest.fixture
def measured(paid_lease, enrol):
    """An active lease on two cards with two hours of readings, an Xid and 1.25 TB sent. The
    readings leave a gap of 25 minutes: longer than two of the chart's 10-minute steps, so a
    whole step is empty wherever the page's steps fall (they start from the page's own clock;
    a gap of one step was drawn as a gap only when both clocks read the same minute modulo 10,
    so a fixture that crossed a minute boundary failed)."""
    lease = paid_lease(offer="2x-a100-sxm")
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])
    lease.refresh_from_db()
    SlotAllocation.objects.filter(lease_id=lease.pk).update(allocated_at=timezone.now() - timedelta(days=1))
    cards = sorted(SlotAllocation.objects.filter(lease_id=lease.pk).values_list("slot__index", flat=True))
    first = int(timezone.now().timestamp() // 60) - 120
    store(node.node.pk, Parsed(
        samples=[(first + m, card, {"util": 50 + card, "mem_mb": 20480, "temp_c": 60, "power_w": 300, "sm_mhz": 1400})
                 for m in range(120) for card in cards if not 30 <= m < 55],       # a gap of 25 minutes
        events=[(first + 5, cards[1], ["xid", 79, 1]), (first + 6, cards[0], ["ecc", 4, 0])]))
    egress_record(lease_id=lease.pk, tb_used=Decimal("1.25"), at=timezone.now())
    return lease, cards, first


def test_lease_page_draws_each_card_without_javascript(measured, customer):
    lease, cards, _ = measured
    client = Client()
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    section = page.split('id="lease-telemetry"')[1].split("</section>")[0]
    assert section.count("<svg") == 4 * len(cards)                 # utilisation, VRAM, temperature, power
    assert section.count("<polyline") == 2 * 4 * len(cards)       # the gap splits each line in two
    assert "<script" not in section
    assert 'viewBox="0 0 300 60"' in section and 'preserveAspectRatio="none"' in section
    assert "20.0 GiB" in section and f"GPU {cards[1]}" in section
    assert "1.250 TB of" in section and "TB included" in section
    assert "Xid 79" in section and "4 corrected, 0 uncorrected" in section


def test_lease_page_without_readings(paid_lease, enrol, customer):
    lease = paid_lease()
    client = Client()
    client.force_login(customer)
    response = client.get(reverse("lease_detail", args=[lease.pk]))
    assert response.status_code == 200


def api(client, token, lease, **query):
    return client.get(f"/api/v1/leases/{lease.pk}/metrics", query, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_metrics_api(measured, customer, other_customer):
    lease, cards, first = measured
    token = api_token_create(customer=customer, name="t")[1]
    client = Client()
    data = api(client, token, lease, since="3h").json()
    assert data["resolution_minutes"] == 1 and data["columns"][0] == "at"
    assert [g["gpu"] for g in data["gpus"]] == cards
    assert len(data["gpus"][0]["points"]) == 120 - 25 and data["gpus"][0]["points"][0][1] == 50 + cards[0]
    assert [e["kind"] for e in data["events"]] == ["ecc", "xid"]
    assert data["egress"]["tb_used"] == "1.250" and data["idle"] == {"util_percent": 5, "hours": 24}
    hourly = api(client, token, lease, since="3h", resolution="60").json()
    assert 2 <= len(hourly["gpus"][0]["points"]) <= 3
    for bad in ({"since": "yesterday"}, {"resolution": "7"}, {"since": "40d"}, {"since": "1h", "until": "2h"},
                {"since": "30d", "resolution": "1"}):
        response = api(client, token, lease, **bad)
        assert response.status_code == 400 and response.json()["error"] == "invalid", bad
    other = api_token_create(customer=other_customer, name="o")[1]
    assert api(client, other, lease).status_code == 404


def test_lease_page_telemetry_in_chinese(measured, customer):
    lease, _, _ = measured
    client = Client()
    client.force_login(customer)
    page = client.get(reverse("lease_detail", args=[lease.pk]), HTTP_ACCEPT_LANGUAGE="zh-Hans,zh;q=0.9").content.decode()
    section = page.split('id="lease-telemetry"')[1].split("</section>")[0]
    assert "GPU 与流量" in section and "利用率" in section and "已用显存" in section and "峰值" in section
    assert "本期出站流量" in section and "ECC 错误：已纠正 4 个" in section

"""`gpu-rent metrics LEASE`: the lease's GPU readings as a compact table (and --json as the
API's object), against the live test server over real HTTP."""
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.egress import egress_record
from fleet.telemetry import Parsed, store
from inventory.models import SlotAllocation

from .helpers import active_lease, login

pytestmark = pytest.mark.django_db(transaction=True)


def test_metrics_table_and_json(cli, catalog, customer):  # noqa: F811
    lease = active_lease(customer, timezone.now() - timedelta(hours=5))
    allocation = SlotAllocation.objects.select_related("slot").get(lease_id=lease.pk)
    SlotAllocation.objects.filter(pk=allocation.pk).update(allocated_at=timezone.now() - timedelta(hours=5))
    card, first = allocation.slot.index, int(timezone.now().timestamp() // 60) - 150
    store(allocation.slot.node_id, Parsed(
        samples=[(first + m, card, {"util": 40 if m < 60 else 80, "mem_mb": 10240, "temp_c": 55, "power_w": 250,
                                    "sm_mhz": 1700}) for m in range(150)],
        events=[(first + 70, card, ["xid", 48, 2])]))
    egress_record(lease_id=lease.pk, tb_used=Decimal("0.5"), at=timezone.now())
    login(cli, customer)
    code, out, err = cli("metrics", str(lease.pk), "--since", "4h")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["TIME", "(UTC)", "GPU", "UTIL%", "VRAM", "GiB", "TEMP", "C", "POWER", "W", "SM", "MHz"]
    rows = [line.split() for line in lines[1:] if line[:2] == "20"]
    assert 3 <= len(rows) <= 4 and {r[4] for r in rows} == {"10.0"}       # hourly rows, 10 GiB
    assert "80" in {r[3] for r in rows}
    assert any("0.500 TB of" in line for line in lines)
    assert any(f"GPU {card}  Xid 48 x2" in line for line in lines)
    code, out, _ = cli("metrics", str(lease.pk), "--since", "3h", "--json")
    data = json.loads(out)
    assert code == 0 and data["resolution_minutes"] == 1 and len(data["gpus"][0]["points"]) == 150
    code, _, err = cli("metrics", str(lease.pk), "--since", "soon")
    assert code != 0 and "since" in err

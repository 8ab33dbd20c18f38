"""Restore into an existing stopped lease, through the storefront on real parts:
PostgreSQL, the test cluster's RGW, a private dockerd, the agent's real converger and restic
(test_snapshot_storefront.NodeLoop). The customer snapshots, writes on, stops the instance
and restores the snapshot from the lease page (a plain form, htmx-enhanced) and again from
the API: the disk then holds exactly the snapshot — later files gone, earlier ones back byte
for byte. A running instance, a snapshot larger than the disk, and a start while the restore
runs are refused with the reason."""
import pytest
from django.urls import reverse
from django.utils import timezone

from tests.storage.snapshot_helpers import _active, _exec, _lease_page, _order, _snapshot_button

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def setup(site_cluster, customer, client, settings):
    from tests.tools import require_tool

    require_tool("restic", "scripts/install-node-tools.sh")
    from billing.services import balance_top_up

    settings.HOST_AGENT = "fleet.driver.NodeAgentDriver"
    settings.STORAGE_QUOTA_BYTES_PER_TB = 2**30
    settings.NODE_REQUESTS_PER_CREDENTIAL_PER_MINUTE = 10_000
    balance_top_up(customer=customer, amount_cents=900_000, now=timezone.now())
    loops = []
    yield loops
    for loop in loops:
        loop.remove_all()


def _action(client, customer, lease, action):
    client.force_login(customer)
    response = client.post(reverse("instance_action", args=[lease.pk, action]), follow=True)
    client.logout()
    return response.content.decode()


def _restore(client, customer, lease, snapshot_id, confirm=True):
    client.force_login(customer)
    data = {"snapshot": snapshot_id, **({"confirm": "yes"} if confirm else {})}
    response = client.post(reverse("instance_restore", args=[lease.pk]), data, follow=True)
    client.logout()
    return response.content.decode()


def _container_state(dockerd, lease):
    found = dockerd.client().containers.list(all=True, filters={"name": f"lease-{lease.pk}"})
    return found[0].status if found else None


def test_a_snapshot_restored_into_the_stopped_lease_replaces_its_disk(setup, customer, client, dockerd,
                                                                      instance_image, tmp_path):
    from fleet.models import Evidence
    from inventory.models import AuditEntry
    from rental.accounts.services import api_token_create
    from rental.models import Lease, Snapshot
    from tests.storage.snapshot_helpers import NodeLoop

    lease, node = _order(customer)
    loop = NodeLoop(client, node, tmp_path / "a", dockerd, instance_image, (23200, 23249))
    setup.append(loop)
    loop.until(lambda: _active(lease), what="lease active")
    digest = _exec(dockerd, lease.pk, "mkdir -p /workspace/run && head -c 32M /dev/urandom > /workspace/run/ckpt.pt "
                                      "&& echo step-1 > /workspace/run/STEP && sha256sum /workspace/run/ckpt.pt"
                   ).split()[0]
    snap = _snapshot_button(client, customer, lease)
    loop.until(lambda: Snapshot.objects.get(pk=snap.pk).state == Snapshot.State.AVAILABLE, what="snapshot ready")
    _exec(dockerd, lease.pk, "echo step-2 > /workspace/run/STEP && head -c 1M /dev/urandom > /workspace/run/later.bin"
          " && head -c 1M /dev/urandom > /workspace/run/ckpt.pt")

    # Running: refused, and the page offers no restore.
    assert 'id="restore-form"' not in _lease_page(client, customer, lease)
    page = _restore(client, customer, lease, snap.pk)
    assert "Stop the instance first" in page
    _, raw = api_token_create(customer=customer, name="restore test")
    api = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    refused = client.post(f"/api/v1/leases/{lease.pk}/restore", {"snapshot": snap.pk}, content_type="application/json",
                          **api)
    assert refused.status_code == 409 and "Stop the instance first" in refused.json()["message"]

    _action(client, customer, lease, "stop")
    loop.until(lambda: _container_state(dockerd, lease) == "exited", what="instance stopped")
    page = _lease_page(client, customer, lease)
    assert 'id="restore-form"' in page and f'<option value="{snap.pk}">' in page
    assert 'hx-post="' + reverse("instance_restore", args=[lease.pk]) + '"' in page and 'hx-select="#lease-live"' in page

    # Larger than this lease's disk: refused with the reason, nothing asked of the node.
    big = Snapshot.objects.create(customer=customer, source_lease=lease, region=lease.site.region, site=lease.site,
                                  size_tb=100, created_at=timezone.now(), paid_until=timezone.now(),
                                  ready_at=timezone.now(), state=Snapshot.State.AVAILABLE, restic_snapshot="0123abcd",
                                  repository=snap.repository, content_bytes=90 * 10**12)
    page = _restore(client, customer, lease, big.pk)
    assert "more than this lease" in page
    assert Lease.objects.get(pk=lease.pk).restore_from_id is None
    # Without the confirmation: refused.
    assert "Tick the box" in _restore(client, customer, lease, snap.pk, confirm=False)

    page = _restore(client, customer, lease, snap.pk)
    assert "Restore requested" in page and 'id="restore-pending"' in page and 'hx-trigger="every 3s"' in page
    assert "A snapshot is being restored onto this disk" in _action(client, customer, lease, "start")
    assert AuditEntry.objects.filter(action="snapshot_restore_into", object_id=str(snap.pk)).exists()
    desired = loop.once()["desired"]["instances"][0]
    assert desired["want"] == "stopped" and desired["restore"]["replace"] is True
    op_id = desired["restore"]["op_id"]
    loop.until(lambda: Lease.objects.get(pk=lease.pk).restored_at is not None, what="restored into the disk")
    assert Evidence.objects.filter(kind="snapshot_restored", lease_id=lease.pk, op_id=op_id).exists()
    assert _container_state(dockerd, lease) == "exited"          # stays stopped until the customer starts it
    assert "restore" not in loop.once()["desired"]["instances"][0]

    _action(client, customer, lease, "start")
    loop.until(lambda: _container_state(dockerd, lease) == "running", what="instance started")
    out = _exec(dockerd, lease.pk, "sha256sum /workspace/run/ckpt.pt; cat /workspace/run/STEP; ls /workspace/run")
    assert out.split()[0] == digest and "step-1" in out and "later.bin" not in out

    # The API does the same for a stopped instance.
    _exec(dockerd, lease.pk, "echo step-3 > /workspace/run/STEP")
    _action(client, customer, lease, "stop")
    loop.until(lambda: _container_state(dockerd, lease) == "exited", what="instance stopped again")
    accepted = client.post(f"/api/v1/leases/{lease.pk}/restore", {"snapshot": snap.pk},
                           content_type="application/json", **api)
    assert accepted.status_code == 202, accepted.content
    assert accepted.json()["op_id"].startswith(f"restore:{lease.pk}:") and accepted.json()["op_id"] != op_id
    loop.until(lambda: Lease.objects.get(pk=lease.pk).restored_at is not None, what="restored again")
    _action(client, customer, lease, "start")
    loop.until(lambda: _container_state(dockerd, lease) == "running", what="instance started again")
    assert "step-1" in _exec(dockerd, lease.pk, "cat /workspace/run/STEP")

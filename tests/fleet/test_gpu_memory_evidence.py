"""The release's `key_destroyed` evidence says, per GPU the lease used on the node, whether
the agent cleared its memory (`gpu_memory_cleared`, nodeagent/gpu_memory.py): an `ok` must
be proven, a `failed` quarantines the node as a failed disk wipe does, and a record from an
agent that predates it is accepted as before."""
import pytest
from django.utils import timezone

from fleet.models import Evidence
from inventory.models import Incident
from rental.models import DiskKey
from tests.fleet.helpers import released

from .conftest import key_destroyed, node_of

pytestmark = pytest.mark.django_db
GPU = "GPU-5ca1ab1e-0000-4000-8000-000000000000"


def cleared(result="ok", verified=True, size=80 * 1024 ** 3, detail=None):
    entry = {"result": result, "method": "cuda-memset-zero", "bytes": size, "total_bytes": 81 * 1024 ** 3,
             "verified": verified, "at": "2026-01-01T00:00:00Z"}
    return {**entry, "detail": detail} if detail else entry


def with_gpus(node, lease, gpus):
    """conftest's key_destroyed, with the GPUs' part."""
    return node.evidence("key_destroyed", lease, device="/dev/vg/lease", luks_uuid="u-1",
                         commands=[{"argv": ["cryptsetup", "erase", "/dev/vg/lease"], "exit": 0}],
                         test_passphrase_exit=2, keyslots_after=0, gpu_memory_cleared=gpus)


def released_on(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    lease = released(lease, node, timezone.now())
    node.desired()
    return lease, node


def test_cleared_gpus_are_recorded_and_the_node_keeps_selling(paid_lease, enrol):
    lease, node = released_on(paid_lease, enrol)
    assert node.report(evidence=[with_gpus(node, lease, {GPU: cleared()})]).json()["accepted"] == ["evidence[0]"]
    assert Evidence.objects.get(kind="key_destroyed").record["gpu_memory_cleared"][GPU]["verified"] is True
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED
    node.node.refresh_from_db()
    assert not node.node.draining and not Incident.objects.filter(node=node.node).exists()


def test_an_unproven_clear_is_refused_and_a_malformed_one_is_invalid(paid_lease, enrol):
    lease, node = released_on(paid_lease, enrol)
    for gpus, error in (({GPU: cleared(verified=False)}, "not_proven"), ({GPU: cleared(size=0)}, "not_proven"),
                        ({GPU: {**cleared(), "result": "maybe"}}, "invalid"), ([GPU], "invalid"),
                        ({GPU: {**cleared(), "bytes": -1}}, "invalid")):
        assert node.report(evidence=[with_gpus(node, lease, gpus)]).json()["refused"] == [
            {"item": "evidence[0]", "error": error}], gpus
    assert not Evidence.objects.filter(kind="key_destroyed").exists()


def test_a_gpu_left_uncleared_quarantines_the_node(paid_lease, enrol):
    lease, node = released_on(paid_lease, enrol)
    gpus = {GPU: cleared(result="failed", verified=False, size=0, detail="cuInit failed with CUDA error 100"),
            "GPU-5ca1ab1e-0000-4000-8000-000000000001": cleared()}
    assert node.report(evidence=[with_gpus(node, lease, gpus)]).json()["accepted"] == ["evidence[0]"]
    node.node.refresh_from_db()
    assert node.node.draining
    incident = Incident.objects.get(node=node.node, ends_at__isnull=True)
    assert f"GPU memory not cleared after lease #{lease.pk}" in incident.reason
    assert GPU in incident.reason and "CUDA error 100" in incident.reason
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED   # the disk goes on


def test_a_record_without_the_field_is_accepted_as_before(paid_lease, enrol):
    lease, node = released_on(paid_lease, enrol)
    assert node.report(evidence=[key_destroyed(node, lease)]).json()["accepted"] == ["evidence[0]"]
    node.node.refresh_from_db()
    assert not node.node.draining

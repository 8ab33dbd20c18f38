"""What a node is told (desired state from the database) and what its reports change:
GPU health → incidents, egress counters → egress metering, a migration → the new node runs
the lease and the customer gets the new connection line."""
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db.models import F
from django.utils import timezone

from billing.models import EgressUsage
from fleet.models import Evidence, InstanceReport, NodeAgent
from inventory.models import Downtime, Incident, Node, SlotAllocation
from rental.failover import node_evacuate
from rental.models import DiskKey, LeaseState, Notification

from .conftest import KEY, key_destroyed, node_of, provision_then_release, ready

pytestmark = pytest.mark.django_db


def slot_indexes(lease):
    return sorted(SlotAllocation.objects.filter(lease_id=lease.pk, released_at__isnull=True)
                  .values_list("slot__index", flat=True))


def test_desired_state_contents(paid_lease, enrol, settings):
    lease = paid_lease(offer="2x-a100-sxm", addons={"extra_nvme_tb": 2})
    node = enrol(node_of(lease))
    doc = node.desired().json()
    assert doc["node"] == node.node.name and doc["poll_seconds"] == settings.NODE_POLL_SECONDS
    assert doc["generated_at"].endswith("Z")
    [wanted] = doc["instances"]
    share = 2 / node.node.gpu_count
    memory = int(node.node.host_ram_gb * share)
    assert wanted == {
        "lease_id": lease.pk, "op_id": f"{lease.pk}:running:1", "want": "running", "disk": "keep",
        "gpus": slot_indexes(lease), "image": "pytorch-2.5-cuda-12.4", "ssh_authorized_keys": [KEY],
        "disk_gb": lease.offer.gpu_model.included_nvme_gb + 2000,
        "cpus": int(node.node.vcpus * share), "memory_gb": memory, "shm_gb": memory // 4,
        "volumes": [],                  # no network volume attached
    }
    assert doc["storage"] is None       # no Ceph cluster at the site
    assert len(wanted["gpus"]) == 2
    # Asking again changes nothing: the same op_id, so the agent does nothing new.
    assert node.desired().json()["instances"] == [wanted]
    assert NodeAgent.objects.get(node=node.node).last_seen_at is not None


def test_suspension_stops_and_payment_resumes_with_new_op_ids(paid_lease, enrol):
    from rental.services import lease_extend, lease_suspend

    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])
    lease.refresh_from_db()
    ops = [node.desired().json()["instances"][0]["op_id"]]
    assert lease_suspend(lease_id=lease.pk, now=lease.ends_at)
    wanted = node.desired().json()["instances"][0]
    assert (wanted["want"], wanted["disk"]) == ("stopped", "keep")
    ops.append(wanted["op_id"])
    assert lease_extend(lease_id=lease.pk, term_start=lease.ends_at, now=lease.ends_at)
    wanted = node.desired().json()["instances"][0]
    assert wanted["want"] == "running"
    ops.append(wanted["op_id"])
    assert len(set(ops)) == 3  # never reused: the agent's journal would skip a repeated one


def test_unhealthy_gpu_opens_one_incident_and_healthy_closes_it(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    [index] = slot_indexes(lease)
    gpu = {"index": index, "uuid": "GPU-abc", "name": "NVIDIA GeForce RTX 3090", "memory_mb": 24576,
           "driver": "550.54.15", "cuda": "12.4", "temperature_c": 90, "ecc_uncorrected": 3, "xid_errors": [79],
           "healthy": False, "problem": "Xid 79: GPU has fallen off the bus"}
    for _ in range(3):
        assert node.report(gpus=[gpu]).json()["accepted"] == ["gpus[0]"]
    incident = Incident.objects.get(slot__node=node.node, slot__index=index)
    assert incident.ends_at is None and incident.source == Incident.Source.HEALTH_CHECK
    assert "fallen off the bus" in incident.reason
    assert not incident.slot.in_service
    assert Downtime.objects.filter(incident=incident, lease_id=lease.pk, ends_at__isnull=True).exists()
    assert NodeAgent.objects.get(node=node.node).gpus[0]["uuid"] == "GPU-abc"
    node.report(gpus=[{**gpu, "healthy": True, "problem": ""}])
    incident.refresh_from_db()
    incident.slot.refresh_from_db()
    assert incident.ends_at is not None and incident.slot.in_service
    assert Incident.objects.count() == 1
    assert node.report(gpus=[{**gpu, "index": 99}]).json()["refused"] == [{"item": "gpus[0]",
                                                                           "error": "unknown_gpu"}]


def test_no_gpu_library_is_a_clear_state(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    assert node.report(gpu_library="none", gpus=[]).status_code == 200
    agent = NodeAgent.objects.get(node=node.node)
    assert (agent.gpu_library, agent.gpus) == ("none", [])
    assert not Incident.objects.exists()


def test_egress_counters_feed_the_egress_metering(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])

    def instance(sent):
        return [{"lease_id": lease.pk, "op_id": f"{lease.pk}:running:1", "state": "running", "ssh_port": 22042,
                 "egress_bytes": sent, "error": None}]

    def ten_hours_later():  # the link bounds what a report can add (fleet.instance_reports.egress_ceiling)
        InstanceReport.objects.filter(lease=lease).update(reported_at=F("reported_at") - timedelta(hours=10))

    node.report(instances=instance(0))
    ten_hours_later()
    node.report(instances=instance(5 * 10**12))
    ten_hours_later()
    node.report(instances=instance(7 * 10**12))
    assert EgressUsage.objects.get(lease=lease).tb_used == Decimal("7.000")
    ten_hours_later()
    node.report(instances=instance(10**12))  # a new container: its counter starts again
    assert EgressUsage.objects.get(lease=lease).tb_used == Decimal("8.000")
    report = InstanceReport.objects.get(lease=lease)
    assert (report.state, report.ssh_port, report.egress_counter) == ("running", 22042, 10**12)


def test_a_steady_instance_is_stored_and_metered_in_aggregate(paid_lease, enrol, settings):
    """An unchanged instance whose counter grew by less than NODE_EGRESS_FLUSH_BYTES
    within NODE_EGRESS_FLUSH_SECONDS writes nothing; the cumulative counter then meters every
    byte in between at once, and a change of state is stored at once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.NODE_EGRESS_FLUSH_BYTES = 10**12
    settings.EGRESS_SLACK_BYTES = 10**13     # gigabytes within milliseconds: plausibility is not this test's
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])

    def instance(sent, state="running"):
        return [{"lease_id": lease.pk, "op_id": f"{lease.pk}:running:1", "state": state, "ssh_port": 22042,
                 "egress_bytes": sent, "error": None}]

    def report(**items):
        node.desired()
        with CaptureQueriesContext(connection) as queries:
            assert node.post(node.body(**items)).status_code == 200
        # The agent's own row (its seq and heartbeat) aside: with Redis a steady report may not
        # write even that (fleet/seq.py).
        return [q["sql"].split()[0:2] for q in queries.captured_queries if q["sql"].startswith(("INSERT", "UPDATE"))
                and '"fleet_nodeagent"' not in q["sql"].split()[1]]

    report(instances=instance(0))
    report(instances=instance(10**9))                  # the first bytes: metered at once
    assert InstanceReport.objects.get(lease=lease).egress_counter == 10**9
    assert EgressUsage.objects.get(lease=lease).tb_used == Decimal("0.001")
    for sent in (2 * 10**9, 3 * 10**9):
        assert report(instances=instance(sent)) == []        # nothing but the seq
    assert InstanceReport.objects.get(lease=lease).egress_counter == 10**9
    settings.NODE_EGRESS_FLUSH_SECONDS = 0
    report(instances=instance(4 * 10**9))
    assert InstanceReport.objects.get(lease=lease).egress_counter == 4 * 10**9
    assert EgressUsage.objects.get(lease=lease).tb_used == Decimal("0.004")   # nothing lost in between
    settings.NODE_EGRESS_FLUSH_SECONDS = 300
    report(instances=instance(4 * 10**9 + 1, state="stopped"))
    assert InstanceReport.objects.get(lease=lease).state == "stopped"


def test_a_flush_within_the_same_gigabyte_meters_its_bytes_and_leaves_the_billed_figure(paid_lease, enrol,
                                                                                      settings):
    """EgressUsage holds TB to the GB: a flush that does not move that figure adds its bytes
    to the meter and writes no usage row; the bytes count when the next flush crosses it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.models import EgressMeter

    settings.NODE_EGRESS_FLUSH_SECONDS = 0   # every report is stored and metered
    settings.EGRESS_SLACK_BYTES = 10**13
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease)])

    def report(sent) -> list[str]:
        item = {"lease_id": lease.pk, "op_id": f"{lease.pk}:running:1", "state": "running", "ssh_port": 22042,
                "egress_bytes": sent, "error": None}
        with CaptureQueriesContext(connection) as queries:
            assert node.report(instances=[item]).status_code == 200
        return [q["sql"] for q in queries.captured_queries if "billing_egressusage" in q["sql"]]

    report(0)
    assert report(10**9)                                       # the first bytes: the term's row
    first = EgressUsage.objects.get(lease=lease)
    assert first.tb_used == Decimal("0.001")
    assert report(14 * 10**8) == []                            # 1.4 GB: still 0.001 TB
    assert EgressMeter.objects.get(lease=lease).bytes_sent == 14 * 10**8
    assert EgressUsage.objects.get(lease=lease).reported_at == first.reported_at
    assert report(16 * 10**8)                                  # 1.6 GB: 0.002 TB
    assert EgressMeter.objects.get(lease=lease).bytes_sent == 16 * 10**8
    assert EgressUsage.objects.get(lease=lease).tb_used == Decimal("0.002")


def test_a_node_with_a_new_address_moves_the_connection_line(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    node.report(evidence=[ready(node, lease, port=22042)])
    body = node.body().replace(b'"public_host": "203.0.113.7"', b'"public_host": "198.51.100.4"')
    assert node.post(body).status_code == 200
    lease.refresh_from_db()
    assert lease.ssh_command == "ssh -p 22042 root@198.51.100.4"
    assert "198.51.100.4" in Notification.objects.get(lease=lease, kind="connection_changed").body


def test_instance_error_is_kept_for_the_customer_page(paid_lease, enrol):
    lease = paid_lease()
    node = enrol(node_of(lease))
    response = node.report(instances=[{"lease_id": lease.pk, "op_id": "x", "state": "failed", "ssh_port": None,
                                       "egress_bytes": 0,
                                       "error": {"code": "image_missing", "detail": "no image pytorch"}}])
    assert response.json()["accepted"] == ["instances[0]"]
    assert InstanceReport.objects.get(lease=lease).error == {"code": "image_missing", "detail": "no image pytorch"}
    from fleet.health import fleet_panel

    assert [r.lease_id for r in fleet_panel(timezone.now()).instance_errors] == [lease.pk]


def test_an_error_reported_after_a_running_report_is_stored_and_cleared_by_the_next(paid_lease, enrol):
    """The stored report's update (not its first insert): every reported value is written."""
    lease = paid_lease()
    node = enrol(node_of(lease))

    def instance(state, port, error=None):
        item = {"lease_id": lease.pk, "op_id": f"{lease.pk}:{state}", "state": state, "ssh_port": port,
                "egress_bytes": 0}
        return node.report(instances=[item if error is None else {**item, "error": error}])

    assert instance("running", 22042).json()["accepted"] == ["instances[0]"]
    failed = {"code": "oom", "detail": "the container ran out of memory"}
    assert instance("failed", None, failed).json()["accepted"] == ["instances[0]"]
    stored = InstanceReport.objects.get(lease=lease)
    assert (stored.state, stored.ssh_port, stored.op_id, stored.error) == ("failed", None, f"{lease.pk}:failed", failed)
    instance("running", 22043)
    stored.refresh_from_db()
    assert (stored.state, stored.ssh_port, stored.error) == ("running", 22043, None)


def test_migration_moves_the_instance_and_tells_the_customer(paid_lease, enrol, operator):
    lease = paid_lease()
    source = enrol(node_of(lease))
    source.report(evidence=[ready(source, lease, port=22042)])
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE
    report = node_evacuate(node=source.node, actor=operator, now=timezone.now())
    assert [m["lease_id"] for m in report.moved] == [lease.pk]
    assert "not copied" in lease.events.get(kind="migrated").data["nvme"]
    target = enrol(node_of(lease))
    assert target.node != source.node
    [on_target] = target.desired().json()["instances"]
    assert (on_target["lease_id"], on_target["want"], on_target["disk"]) == (lease.pk, "running", "keep")
    [on_source] = source.desired().json()["instances"]
    assert (on_source["want"], on_source["disk"]) == ("absent", "destroy_key")
    # The old node's instance can no longer take the connection line.
    source.report(evidence=[ready(source, lease, port=22999, op_id="late")])
    lease.refresh_from_db()
    assert lease.ssh_port == 22042
    target.public_host = "198.51.100.20"
    body = target.body(evidence=[ready(target, lease, port=23001)])
    body = body.replace(b'"public_host": "203.0.113.7"', b'"public_host": "198.51.100.20"')
    assert target.post(body).json()["accepted"] == ["evidence[0]"]
    lease.refresh_from_db()
    assert lease.ssh_command == "ssh -p 23001 root@198.51.100.20"
    event = lease.events.get(kind="connection_changed")
    assert event.data["host"] == "198.51.100.20"
    notice = Notification.objects.get(lease=lease, kind="connection_changed")
    assert "ssh -p 23001 root@198.51.100.20" in notice.body
    # The source proves its copy's key gone: kept as evidence, the lease's own key stays.
    assert source.report(evidence=[key_destroyed(source, lease, op_id=on_source["op_id"])]).json()["accepted"] == [
        "evidence[0]"]
    assert Evidence.objects.filter(node=source.node, kind="key_destroyed").exists()
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.ACTIVE


def test_after_a_migration_only_the_last_node_wipes_the_ended_lease(paid_lease, enrol, operator):
    """The module's rule (fleet/desired.py): disk work only of the node the lease was on
    last. A lease that moved and then ended is wiped on its new node; the node it left holds
    only a copy whose key it was told to destroy, and is never told to wipe a disk that
    belongs to the new node's slot."""
    from rental.services import lease_release, lease_suspend

    lease = paid_lease()
    source = enrol(node_of(lease))
    source.report(evidence=[ready(source, lease, port=22042)])
    node_evacuate(node=source.node, actor=operator, now=timezone.now())
    target = enrol(node_of(lease))
    target.report(evidence=[ready(target, lease, port=23001)])
    lease.refresh_from_db()
    lease_suspend(lease_id=lease.pk, now=lease.ends_at)
    lease.refresh_from_db()
    lease_release(lease_id=lease.pk, now=lease.hold_until)

    def wanted(node):
        [item] = node.desired().json()["instances"]
        return item["want"], item["disk"], item["op_id"]

    assert wanted(target)[:2] == ("absent", "destroy_key")
    target.report(evidence=[key_destroyed(target, lease, op_id=wanted(target)[2])])
    assert DiskKey.objects.get(lease=lease).state == DiskKey.State.DESTROYED
    assert wanted(target)[:2] == ("absent", "wipe")
    assert wanted(source)[:2] == ("absent", "destroy_key")


@pytest.mark.parametrize("gpu_count,vcpus,ram_gb,expected", [
    (1, 7, 30, (7, 30, 7)),     # the node's only GPU: all of it; /dev/shm a quarter of the memory
    (3, 7, 30, (2, 10, 2)),     # a third, rounded down to whole CPUs and GB
    (8, 7, 20, (0, 2, 1)),      # an eighth of 20 GB: 2 GB, and /dev/shm never under 1 GB
])
def test_an_instance_gets_the_nodes_cpus_and_memory_in_proportion_of_its_gpus(
        paid_lease, enrol, gpu_count, vcpus, ram_gb, expected):
    """The desired state's resources (PROTOCOL.md): the lease's share of the node's CPUs and
    memory is its GPUs over the node's, in whole CPUs and GB rounded down; /dev/shm is a
    quarter of that memory (SHM_SHARE_OF_MEMORY), at least 1 GB; a lease with no GPU on the
    node any more gets none of it."""

    lease = paid_lease()  # one GPU
    node = enrol(node_of(lease))
    Node.objects.filter(pk=node.node.pk).update(gpu_count=gpu_count, vcpus=vcpus, host_ram_gb=ram_gb)
    [item] = node.desired().json()["instances"]
    assert (item["cpus"], item["memory_gb"], item["shm_gb"]) == expected
    provision_then_release(node, lease)
    [item] = node.desired().json()["instances"]
    assert (item["gpus"], item["cpus"], item["memory_gb"], item["shm_gb"]) == ([], 0, 0, 0)


def test_an_ended_lease_keeps_its_disk_until_rental_asks_for_the_key(paid_lease, enrol):
    """Disk work only once rental asked for it (fleet/desired.py): an ended lease whose key
    nobody asked to destroy (its key still active) is removed from the node, disk kept."""

    lease = paid_lease()
    node = enrol(node_of(lease))
    provision_then_release(node, lease)
    DiskKey.objects.filter(lease=lease).update(state=DiskKey.State.ACTIVE)  # as before rental's request
    [item] = node.desired().json()["instances"]
    assert (item["want"], item["disk"]) == ("absent", "keep")

"""Incidents take hardware out of stock and record downtime; a failed node's leases are
migrated to another node at the same site, with events and the time taken; refusals say
which lease could not move."""
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse
from django.utils import timezone

from inventory.incidents import IncidentRefused, health_report, incident_close, incident_open
from inventory.models import AuditEntry, Downtime, GpuSlot, Incident, Node, SlotAllocation
from inventory.selectors import free_gpus_by_model_and_site
from rental.failover import MigrationRefused, incident_migrate, node_evacuate
from rental.models import LeaseEvent, Notification


def node_of(lease):
    return SlotAllocation.objects.get(lease_id=lease.pk, released_at__isnull=True).slot.node


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


def test_node_failure_end_to_end(catalog, customer, other_customer, operator, place, now):
    a = place(customer, now - timedelta(hours=2))
    b = place(other_customer, now - timedelta(hours=2))
    failed = node_of(a)
    assert node_of(b) == failed
    free_before = free_gpus_by_model_and_site()[(failed.gpu_model_id, "DFW-1")]

    incident = incident_open(node=failed, kind="down", starts_at=now - timedelta(minutes=12),
                             reason="PSU failure", actor=operator)
    assert not GpuSlot.objects.filter(node=failed, in_service=True).exists()
    # The node's 6 free slots left stock (the 2 leased ones were not counted as free).
    assert free_gpus_by_model_and_site()[(failed.gpu_model_id, "DFW-1")] == free_before - 6
    downs = Downtime.objects.filter(incident=incident).order_by("lease_id")
    assert [(d.lease_id, d.starts_at, d.ends_at) for d in downs] == [
        (a.pk, now - timedelta(minutes=12), None), (b.pk, now - timedelta(minutes=12), None)]
    assert AuditEntry.objects.filter(action="incident_open", object_id=str(incident.pk)).exists()

    report = incident_migrate(incident=incident, actor=operator, now=now)
    assert not report.refused and {m["lease_id"] for m in report.moved} == {a.pk, b.pk}
    for lease in (a, b):
        target = node_of(lease)
        assert target != failed and target.site.code == "DFW-1" and target.gpu_model == failed.gpu_model
        event = LeaseEvent.objects.get(lease=lease, kind="migrated")
        assert event.actor == operator and event.from_state == event.to_state == "active"
        assert event.data["from_node"] == failed.name and event.data["to_node"] == target.name
        assert event.data["seconds"] == 12 * 60 and event.data["within_target"] is True
        assert "NVMe" in event.data["nvme"]
        assert Downtime.objects.get(lease_id=lease.pk).ends_at == now
    assert "in 12 min" in report.summary
    # Nothing of the failed node is held any more; the old allocations are closed.
    assert not SlotAllocation.objects.filter(slot__node=failed, released_at__isnull=True).exists()

    assert incident_close(incident=incident, actor=operator, now=now + timedelta(hours=1))
    assert GpuSlot.objects.filter(node=failed, in_service=True).count() == failed.gpu_count
    assert not incident_close(incident=incident, actor=operator)  # closing twice is harmless


def test_migration_refused_when_nothing_fits_says_which_lease(catalog, customer, operator, place, now):
    # DFW-1 has a single H200 node: there is nowhere to go at the same site.
    lease = place(customer, now - timedelta(hours=1), offer="h200-sxm")
    failed = node_of(lease)
    incident = incident_open(node=failed, starts_at=now - timedelta(minutes=5), reason="NVLink errors")
    report = incident_migrate(incident=incident, actor=operator, now=now)
    assert report.moved == []
    assert report.refused == [(lease.pk, "no other node at DFW-1 has 1 free H200 SXM slot(s) in service")]
    assert f"Could not move lease #{lease.pk}" in report.summary
    assert node_of(lease) == failed  # kept its slots: the transaction rolled back
    assert not LeaseEvent.objects.filter(lease=lease, kind="migrated").exists()
    assert Downtime.objects.get(lease_id=lease.pk).ends_at is None
    site_wide = incident_open(site=failed.site, starts_at=now, reason="power")
    with pytest.raises(MigrationRefused, match="whole site"):
        incident_migrate(incident=site_wide)


def test_late_migration_is_recorded_over_target(catalog, customer, place, now):
    lease = place(customer, now - timedelta(hours=3))
    failed = node_of(lease)
    incident_open(node=failed, starts_at=now - timedelta(minutes=45), reason="fan")
    report = node_evacuate(node=failed, now=now)
    assert report.moved[0]["seconds"] == 45 * 60 and report.moved[0]["within_target"] is False
    assert "over the 30-minute target" in report.summary


def test_overlapping_incidents_and_retrospective_record(catalog, customer, place, now):
    lease = place(customer, now - timedelta(days=2))
    node = node_of(lease)
    leased = SlotAllocation.objects.get(lease_id=lease.pk, released_at__isnull=True).slot_id
    slot = GpuSlot.objects.filter(node=node).exclude(pk=leased).first()
    on_node = incident_open(node=node, starts_at=now - timedelta(minutes=30), reason="node")
    on_slot = incident_open(slot=slot, starts_at=now - timedelta(minutes=20), reason="gpu")
    incident_close(incident=on_node, now=now)
    slot.refresh_from_db()
    assert not slot.in_service  # still covered by the slot incident
    assert GpuSlot.objects.filter(node=node, in_service=True).count() == node.gpu_count - 1
    incident_close(incident=on_slot, now=now)
    slot.refresh_from_db()
    assert slot.in_service
    # An outage entered after the fact: downtime for the lease, slots untouched.
    past = incident_open(node=node, starts_at=now - timedelta(days=1), ends_at=now - timedelta(days=1, minutes=-40),
                         reason="found in the logs")
    d = Downtime.objects.get(incident=past)
    assert (d.lease_id, d.ends_at - d.starts_at) == (lease.pk, timedelta(minutes=40))
    assert GpuSlot.objects.filter(node=node, in_service=True).count() == node.gpu_count


def test_a_slot_in_repair_stays_out_after_an_incident(catalog, now):
    node = Node.objects.filter(site__code="DFW-1", gpu_model__slug="rtx-3090").first()
    repair = GpuSlot.objects.filter(node=node).first()
    GpuSlot.objects.filter(pk=repair.pk).update(in_service=False)
    incident = incident_open(node=node, starts_at=now, reason="x")
    incident_close(incident=incident, now=now + timedelta(minutes=1))
    assert GpuSlot.objects.filter(node=node, in_service=False).get() == repair


def test_incident_validation(catalog, now):
    node = Node.objects.first()
    with pytest.raises(IncidentRefused, match="exactly one"):
        incident_open(node=node, site=node.site, starts_at=now, reason="x")
    with pytest.raises(IncidentRefused, match="reason"):
        incident_open(node=node, starts_at=now, reason=" ")
    with pytest.raises(IncidentRefused, match="future"):
        incident_open(node=node, starts_at=now + timedelta(hours=1), reason="x")


def test_health_check_opens_once_and_closes(catalog, customer, place, now):
    lease = place(customer, now - timedelta(hours=1))
    node = node_of(lease)
    first = health_report(node=node, healthy=False, at=now - timedelta(minutes=3), detail="ECC errors")
    again = health_report(node=node, healthy=False, at=now - timedelta(minutes=2))
    assert first == again and first.source == "health_check"
    assert Incident.objects.count() == 1
    health_report(node=node, healthy=True, at=now)
    first.refresh_from_db()
    assert first.ends_at == now and Downtime.objects.get(lease_id=lease.pk).ends_at == now


def test_admin_opens_incident_and_migrates(catalog, customer, place, op_client, now):
    lease = place(customer, now - timedelta(hours=1))
    failed = node_of(lease)
    response = op_client.post(reverse("admin:inventory_incident_add"), {
        "node": failed.pk, "kind": "down", "starts_at_0": (now - timedelta(minutes=4)).strftime("%Y-%m-%d"),
        "starts_at_1": (now - timedelta(minutes=4)).strftime("%H:%M:%S"), "reason": "GPU fell off the bus",
        "downtime_set-TOTAL_FORMS": "0", "downtime_set-INITIAL_FORMS": "0", "downtimes-TOTAL_FORMS": "0",
        "downtimes-INITIAL_FORMS": "0"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    incident = Incident.objects.get()
    assert incident.created_by.username == "op" and Downtime.objects.filter(incident=incident).count() == 1
    # Taking hardware out of service tells its customers, once per lease and incident.
    notice = Notification.objects.get(lease=lease, kind="incident")
    assert notice.deadline == incident.starts_at and "out of service" in notice.subject
    response = op_client.post(reverse("admin:inventory_incident_changelist"), {
        "action": "migrate_leases", ACTION_CHECKBOX_NAME: [str(incident.pk)]}, follow=True)
    text = response.content.decode()
    assert f"lease #{lease.pk} {failed.name} →" in text
    assert node_of(lease) != failed
    # The node screen has the same action.
    response = op_client.post(reverse("admin:inventory_node_changelist"), {
        "action": "migrate_leases", ACTION_CHECKBOX_NAME: [str(failed.pk)]}, follow=True)
    assert "No live lease on that hardware." in response.content.decode()

"""The operator's day in the admin: a node created with n GPUs gets n slots (no more),
lowering the count is refused while the slots have history, node changes are audited."""
import pytest
from django.urls import reverse

from inventory.models import AuditEntry, GpuModel, GpuSlot, Node, Site, SlotAllocation


@pytest.fixture
def op_client(client, operator):
    client.force_login(operator)
    return client


def _node_form(**overrides):
    data = {"site": Site.objects.get(code="PDX-1").pk, "name": "pdx1-a100-99",
            "gpu_model": GpuModel.objects.get(slug="a100-sxm").pk, "gpu_count": "4", "vcpus": "64",
            "host_ram_gb": "512", "nvme_max_tb": "30",
            "slots-TOTAL_FORMS": "0", "slots-INITIAL_FORMS": "0", "slots-MIN_NUM_FORMS": "0", "slots-MAX_NUM_FORMS": "0"}
    data.update(overrides)
    return data


def test_creating_a_node_creates_its_slots_and_an_audit_row(op_client, catalog, operator):
    response = op_client.post(reverse("admin:inventory_node_add"), _node_form())
    assert response.status_code == 302, response.content.decode()[:2000]
    node = Node.objects.get(name="pdx1-a100-99")
    assert sorted(node.slots.values_list("index", flat=True)) == [0, 1, 2, 3]
    entry = AuditEntry.objects.get(action="node_created", object_id=str(node.pk))
    assert entry.actor == operator and entry.detail["gpu_count"][1] == "4"


def test_more_than_eight_gpus_is_refused(op_client, catalog):
    response = op_client.post(reverse("admin:inventory_node_add"), _node_form(gpu_count="9"))
    assert response.status_code == 200 and "1 to 8 GPUs" in response.content.decode()
    assert not Node.objects.filter(name="pdx1-a100-99").exists()


def test_lowering_the_gpu_count_below_used_slots_is_refused(op_client, catalog):
    op_client.post(reverse("admin:inventory_node_add"), _node_form())
    node = Node.objects.get(name="pdx1-a100-99")
    SlotAllocation.objects.create(slot=GpuSlot.objects.get(node=node, index=3), lease_id=123456)
    data = _node_form(gpu_count="2")
    response = op_client.post(reverse("admin:inventory_node_change", args=[node.pk]), data)
    assert response.status_code == 200 and "have had leases" in response.content.decode()
    assert node.slots.count() == 4


def test_lowering_the_gpu_count_of_unused_slots_removes_them_and_is_audited(op_client, catalog):
    op_client.post(reverse("admin:inventory_node_add"), _node_form())
    node = Node.objects.get(name="pdx1-a100-99")
    response = op_client.post(reverse("admin:inventory_node_change", args=[node.pk]),
                              _node_form(gpu_count="2", **{"slots-TOTAL_FORMS": "0", "slots-INITIAL_FORMS": "0"}))
    assert response.status_code == 302
    assert sorted(node.slots.values_list("index", flat=True)) == [0, 1]
    assert AuditEntry.objects.get(action="node_changed", object_id=str(node.pk)).detail["gpu_count"] == ["4", "2"]


def test_the_operators_lost_first_password_can_be_reset_from_the_shell(db):
    from io import StringIO

    from django.contrib.auth.models import User
    from django.core.management import call_command

    out = StringIO()
    call_command("create_operator", stdout=out)
    first = out.getvalue().split("password: ")[1].split()[0]
    out = StringIO()
    call_command("create_operator", "--reset-password", stdout=out)
    new = out.getvalue().split("operator: ")[1].split()[0]
    assert new != first
    operator = User.objects.get(username="operator")
    assert operator.check_password(new) and not operator.check_password(first)
    assert AuditEntry.objects.filter(action="operator_password_reset").count() == 1


# --- the customer desk: balance adjustment and refund, with a reason, audited ---------------

def test_customer_desk_shows_everything_and_adjusts_the_balance_with_a_reason(op_client, catalog, customer):
    from billing.models import LedgerEntry
    from tests.factories import place

    lease, invoice = place(customer)
    url = reverse("admin:ops_customer", args=[customer.pk])
    page = op_client.get(url).content.decode()
    assert f"#{lease.pk}" in page or f">{lease.pk}<" in page
    assert customer.username in op_client.get(reverse("admin:ops_customers"), {"q": "ali"}).content.decode()

    refused = op_client.post(url, {"action": "adjust", "adjust-amount": "12.50", "adjust-reason": ""})
    assert refused.status_code == 400 and not LedgerEntry.objects.filter(kind="adjustment").exists()
    op_client.post(url, {"action": "adjust", "adjust-amount": "12.50", "adjust-reason": "goodwill for a slow disk"})
    entry = LedgerEntry.objects.get(kind="adjustment")
    assert entry.amount_cents == 1250 and entry.memo == "goodwill for a slow disk"
    assert AuditEntry.objects.filter(action="balance_adjusted", object_id=str(customer.pk)).exists()

    op_client.post(url, {"action": "adjust", "adjust-amount": "-20.00", "adjust-reason": "too much"})
    assert LedgerEntry.objects.filter(kind="adjustment").count() == 1  # never below zero


def test_customer_desk_refunds_a_paid_invoice_once(op_client, catalog, customer):
    from django.utils import timezone

    from billing.models import Invoice, LedgerEntry
    from billing.services import balance_top_up
    from tests.factories import place

    balance_top_up(customer=customer, amount_cents=100_00, now=timezone.now())
    _lease, invoice = place(customer, pay=True)
    url = reverse("admin:ops_customer", args=[customer.pk])
    # Its lease is live (provisioning): the desk warns first and refunds only once confirmed.
    warned = op_client.post(url, {"action": "refund", "refund-invoice": str(invoice.pk), "refund-reason": "card failed"})
    assert warned.status_code == 400 and "does not stop the lease" in warned.content.decode()
    assert not LedgerEntry.objects.filter(kind="refund").exists()
    for _ in range(2):
        op_client.post(url, {"action": "refund", "refund-invoice": str(invoice.pk), "refund-reason": "card failed",
                             "refund-lease_keeps_running": "on"})
    assert LedgerEntry.objects.filter(kind="refund").count() == 1
    assert Invoice.objects.get(pk=invoice.pk).refunded_at is not None


def test_customer_desk_needs_permissions(client, catalog, customer, django_user_model):
    from tests.otp import authenticator_for

    staff = django_user_model.objects.create_user(username="intern", password="x" * 12, is_staff=True)
    authenticator_for(staff)  # past the two-factor step: what stops them is the permission
    client.force_login(staff)
    url = reverse("admin:ops_customer", args=[customer.pk])
    assert client.get(url).status_code == 403
    assert client.post(url, {"action": "adjust", "adjust-amount": "5", "adjust-reason": "x"}).status_code == 403


def test_customer_desk_reading_does_not_allow_moving_money(client, catalog, customer, django_user_model):
    """Staff who may read the desk (auth.view_user) see it, and are refused both money
    actions: what refuses them is the money permission, the read check having passed."""
    from django.contrib.auth.models import Permission
    from django.utils import timezone

    from billing.models import Account, LedgerEntry
    from billing.services import balance_top_up
    from tests.factories import place
    from tests.otp import authenticator_for

    staff = django_user_model.objects.create_user(username="reader", password="x" * 12, is_staff=True)
    authenticator_for(staff)
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="auth", codename="view_user"))
    balance_top_up(customer=customer, amount_cents=100_00, now=timezone.now())
    _lease, invoice = place(customer, pay=True)
    before = LedgerEntry.objects.count(), Account.objects.get(customer=customer).balance_cents
    client.force_login(staff)
    url = reverse("admin:ops_customer", args=[customer.pk])
    assert client.get(url).status_code == 200
    assert client.post(url, {"action": "adjust", "adjust-amount": "5", "adjust-reason": "x"}).status_code == 403
    assert client.post(url, {"action": "refund", "refund-invoice": str(invoice.pk),
                             "refund-reason": "x"}).status_code == 403
    assert (LedgerEntry.objects.count(), Account.objects.get(customer=customer).balance_cents) == before

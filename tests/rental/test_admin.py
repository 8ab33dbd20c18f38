"""The operators' admin: lease list filters and search, the read-only change page with its
timeline, events and key proof, actions that call services (with confirmation pages for
suspend and release), manual settlement, and read-only audit screens."""
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse
from django.utils import timezone

from billing.models import Invoice
from billing.services import balance_top_up, checkout_place_order
from inventory.models import Offer, Site, SlotAllocation
from ops.lifecycle import run_lifecycle
from rental.models import DiskKey, Image, Lease, LeaseEvent, LeaseState

S = LeaseState
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"
CHANGELIST = "admin:rental_lease_changelist"


def place(customer, now, *, pay=True, offer="rtx-3090"):
    if pay:
        balance_top_up(customer=customer, amount_cents=6500, now=now)
    return checkout_place_order(customer=customer, offer=Offer.objects.get(slug=offer),
                                site=Site.objects.get(code="DFW-1"), term="week",
                                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY,
                                pay_from_balance=pay, now=now)


@pytest.fixture
def active_lease(catalog, customer, settings):
    """Paid a week ago minus 12 hours: active, ends within 24 h."""
    settings.HOST_AGENT_FAKE_DELAY = 0
    start = timezone.now() - timedelta(days=6, hours=12)
    lease, _ = place(customer, start)
    run_lifecycle(start + timedelta(minutes=1))
    lease.refresh_from_db()
    assert lease.state == S.ACTIVE
    return lease


@pytest.fixture
def op_client(client, operator):
    client.force_login(operator)
    return client


def post_action(client, action, ids, url=CHANGELIST, **extra):
    return client.post(reverse(url), {"action": action, ACTION_CHECKBOX_NAME: [str(i) for i in ids], **extra},
                       follow=False)


def ids_in(response):
    return {obj.pk for obj in response.context["cl"].result_list}


def test_changelist_filters_by_state_site_offer_and_deadline(op_client, active_lease, other_customer):
    pending, _ = place(other_customer, timezone.now(), pay=False, offer="h100-sxm")
    url = reverse(CHANGELIST)
    response = op_client.get(url)
    assert response.status_code == 200 and ids_in(response) == {active_lease.pk, pending.pk}
    assert ids_in(op_client.get(url, {"state__exact": "active"})) == {active_lease.pk}
    assert ids_in(op_client.get(url, {"offer__id__exact": pending.offer_id})) == {pending.pk}
    assert ids_in(op_client.get(url, {"site__id__exact": active_lease.site_id})) == {active_lease.pk, pending.pk}
    assert ids_in(op_client.get(url, {"deadline": "ends_renewal"})) == {active_lease.pk}
    assert ids_in(op_client.get(url, {"deadline": "ends_hold"})) == {active_lease.pk}
    assert ids_in(op_client.get(url, {"deadline": "hold_24h"})) == set()
    assert ids_in(op_client.get(url, {"deadline": "wipe_due"})) == set()
    # Search by id (with or without '#') and by username.
    assert ids_in(op_client.get(url, {"q": f"#{pending.pk}"})) == {pending.pk}
    assert ids_in(op_client.get(url, {"q": "alice"})) == {active_lease.pk}
    content = response.content.decode()
    assert "ends within 24 h" in content and "hold expires within 24 h" in content and "wipe overdue" in content


def test_hold_and_wipe_filters(op_client, active_lease):
    now = timezone.now()
    Lease.objects.filter(pk=active_lease.pk).update(state=S.SUSPENDED, hold_until=now + timedelta(hours=5))
    url = reverse(CHANGELIST)
    assert ids_in(op_client.get(url, {"deadline": "hold_24h"})) == {active_lease.pk}
    Lease.objects.filter(pk=active_lease.pk).update(state=S.RELEASED, wipe_by=now - timedelta(minutes=1))
    assert ids_in(op_client.get(url, {"deadline": "wipe_due"})) == {active_lease.pk}


def test_change_page_is_read_only_with_timeline_events_and_key(op_client, active_lease):
    url = reverse("admin:rental_lease_change", args=[active_lease.pk])
    response = op_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "lease-timeline" in html and "Renewal invoice issued" in html and "provisioned" in html
    assert active_lease.disk_key.key_ref in html
    form = response.context["adminform"].form
    assert "state" not in form.fields and "ends_at" not in form.fields
    # Posting a state change does nothing.
    op_client.post(url, {"state": "wiped", "ends_at": "2000-01-01 00:00"})
    active_lease.refresh_from_db()
    assert active_lease.state == S.ACTIVE
    assert op_client.get(reverse("admin:rental_lease_add")).status_code == 403


def test_extend_action_adds_a_free_term_with_operator_as_actor(op_client, operator, active_lease):
    old_end = active_lease.ends_at
    response = post_action(op_client, "extend_free", [active_lease.pk])
    assert response.status_code == 302
    active_lease.refresh_from_db()
    assert active_lease.ends_at == old_end + timedelta(days=7) and active_lease.state == S.ACTIVE
    event = LeaseEvent.objects.get(lease=active_lease, kind="extended_by_operator")
    assert event.actor == operator and event.data["free_of_charge"] is True
    assert not Invoice.objects.filter(lease=active_lease, kind="renewal", state="paid").exists()


def test_suspend_asks_for_a_reason_then_suspends_and_resume_resumes(op_client, operator, active_lease):
    first = post_action(op_client, "suspend_now", [active_lease.pk])
    assert first.status_code == 200 and b"Yes, suspend" in first.content and b"reason" in first.content
    active_lease.refresh_from_db()
    assert active_lease.state == S.ACTIVE  # nothing yet
    empty = post_action(op_client, "suspend_now", [active_lease.pk], post="yes", reason="")
    assert empty.status_code == 200 and b"This field is required" in empty.content
    done = post_action(op_client, "suspend_now", [active_lease.pk], post="yes", reason="abuse report #7")
    assert done.status_code == 302
    active_lease.refresh_from_db()
    assert active_lease.state == S.SUSPENDED
    event = LeaseEvent.objects.get(lease=active_lease, kind="suspended")
    assert event.actor == operator and event.reason == "abuse report #7"

    post_action(op_client, "resume", [active_lease.pk])
    active_lease.refresh_from_db()
    assert active_lease.state == S.ACTIVE and active_lease.hold_until is None
    assert LeaseEvent.objects.get(lease=active_lease, kind="resumed").actor == operator


def test_release_with_confirmation_frees_slots_and_destroys_key(op_client, operator, active_lease,
                                                                django_capture_on_commit_callbacks):
    # Release refuses an active lease.
    post_action(op_client, "release", [active_lease.pk], post="yes", reason="x")
    active_lease.refresh_from_db()
    assert active_lease.state == S.ACTIVE
    post_action(op_client, "suspend_now", [active_lease.pk], post="yes", reason="customer asked to stop")
    # Mid-term the paid term protects the disk key: release is refused with a message.
    refused = post_action(op_client, "release", [active_lease.pk], post="yes", reason="too early")
    assert any("paid term" in str(m) for m in refused.wsgi_request._messages)
    active_lease.refresh_from_db()
    assert active_lease.state == S.SUSPENDED
    # Once the term is over, the operator can release before the hold ends.
    Lease.objects.filter(pk=active_lease.pk).update(ends_at=timezone.now() - timedelta(hours=1))
    page = post_action(op_client, "release", [active_lease.pk])
    assert page.status_code == 200 and b"cannot be undone" in page.content
    with django_capture_on_commit_callbacks(execute=True):
        post_action(op_client, "release", [active_lease.pk], post="yes", reason="customer asked to stop")
    active_lease.refresh_from_db()
    assert active_lease.state == S.RELEASED
    assert not SlotAllocation.objects.filter(lease_id=active_lease.pk, released_at__isnull=True).exists()
    key = DiskKey.objects.get(lease=active_lease)
    assert key.state == DiskKey.State.DESTROYED and key.destroy_requested_by == operator
    assert LeaseEvent.objects.get(lease=active_lease, kind="released").actor == operator
    html = op_client.get(reverse("admin:rental_lease_change", args=[active_lease.pk])).content.decode()
    assert "luks-key-destroyed" in html  # the destruction proof is shown


def test_actions_refuse_wrong_states_with_a_message(op_client, catalog, customer):
    pending, _ = place(customer, timezone.now(), pay=False)
    response = post_action(op_client, "extend_free", [pending.pk])
    assert response.status_code == 302
    messages = [str(m) for m in response.wsgi_request._messages]
    assert any("no term to extend" in m for m in messages)
    post_action(op_client, "suspend_now", [pending.pk], post="yes", reason="test")
    post_action(op_client, "resume", [pending.pk])
    pending.refresh_from_db()
    assert pending.state == S.PENDING


def test_invoice_admin_settle_manually_with_note(op_client, operator, catalog, customer):
    lease, invoice = place(customer, timezone.now(), pay=False)
    url = "admin:billing_invoice_changelist"
    page = post_action(op_client, "settle_manually", [invoice.pk], url=url)
    assert page.status_code == 200 and b"note" in page.content
    post_action(op_client, "settle_manually", [invoice.pk], url=url, post="yes", note="wire ref 991")
    invoice.refresh_from_db()
    assert invoice.state == Invoice.State.PAID and invoice.paid_via == "manual"
    assert invoice.settled_by == operator and invoice.note == "wire ref 991"
    lease.refresh_from_db()
    assert lease.state == S.PROVISIONING
    # Twice: refused with a message, nothing changes.
    again = post_action(op_client, "settle_manually", [invoice.pk], url=url, post="yes", note="again")
    assert any("not open" in str(m) for m in again.wsgi_request._messages)
    listing = op_client.get(reverse(url), {"state__exact": "paid", "kind__exact": "order"})
    assert listing.status_code == 200 and ids_in(listing) == {invoice.pk}
    detail = op_client.get(reverse("admin:billing_invoice_change", args=[invoice.pk]))
    assert detail.status_code == 200 and b"week" in detail.content  # the line inline


@pytest.mark.parametrize("model", ["rental/leaseevent", "rental/notification", "billing/ledgerentry",
                                   "billing/account", "billing/jobrun"])
def test_audit_screens_are_read_only(op_client, active_lease, model):
    app, name = model.split("/")
    assert op_client.get(reverse(f"admin:{app}_{name}_changelist")).status_code == 200
    assert op_client.get(reverse(f"admin:{app}_{name}_add")).status_code == 403
    from django.apps import apps

    obj = apps.get_model(app, name).objects.first()
    if obj is not None:
        change = op_client.get(reverse(f"admin:{app}_{name}_change", args=[obj.pk]))
        assert change.status_code == 200 and b'type="submit" value="Save"' not in change.content
        assert op_client.post(reverse(f"admin:{app}_{name}_delete", args=[obj.pk])).status_code == 403


def test_image_admin_lists_images(op_client, catalog):
    response = op_client.get(reverse("admin:rental_image_changelist"))
    assert response.status_code == 200 and b"ROCm" in response.content

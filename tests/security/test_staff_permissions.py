"""Staff without permissions: being staff opens the admin, not the
operations views. The dashboard needs billing.view_ops_dashboard; each CSV export needs the
view permission of what it exports; admin actions that change leases, invoices, nodes or
SLA claims need the change permission, not just the view one."""
import pytest
from django.urls import reverse

from rental.models import LeaseEvent, LeaseState
from tests.otp import authenticator_for
from tests.security.helpers import grant

pytestmark = pytest.mark.django_db
PERIOD = {"date_from": "2025-06-01", "date_to": "2025-06-30"}


@pytest.fixture
def clerk(django_user_model):
    """Staff, with an authenticator and no permissions."""
    user = django_user_model.objects.create_user(username="clerk", password="clerk pass 12345", is_staff=True)
    authenticator_for(user)
    return user


def test_staff_without_permissions_get_403_on_ops_views(client, clerk):
    client.force_login(clerk)
    assert client.get(reverse("admin:index")).status_code == 200
    assert client.get(reverse("admin:ops_dashboard")).status_code == 403
    assert client.get(reverse("admin:ops_exports")).status_code == 403
    for what in ("leases", "invoices", "payments"):
        assert client.get(reverse("admin:ops_exports"), {"what": what, **PERIOD}).status_code == 403, what
    assert client.get(reverse("admin:ops_holds")).status_code == 403


def test_each_export_needs_the_view_permission_of_what_it_exports(client, clerk):
    client.force_login(grant(clerk, "billing.view_invoice"))
    assert client.get(reverse("admin:ops_exports")).status_code == 200
    response = client.get(reverse("admin:ops_exports"), {"what": "invoices", **PERIOD})
    assert response.status_code == 200 and response.streaming
    for what in ("leases", "payments"):
        assert client.get(reverse("admin:ops_exports"), {"what": what, **PERIOD}).status_code == 403, what
    assert client.get(reverse("admin:ops_dashboard")).status_code == 403


def test_the_dashboard_needs_its_named_permission(client, clerk):
    client.force_login(grant(clerk, "billing.view_ops_dashboard"))
    assert client.get(reverse("admin:ops_dashboard")).status_code == 200


@pytest.fixture
def active_lease(catalog, customer, settings):
    from django.utils import timezone

    from billing.services import balance_top_up
    from rental.lifecycle import sweep_provisioning
    from tests.factories import place

    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=10_000_00, now=timezone.now())
    lease, _invoice = place(customer, pay=True)
    sweep_provisioning(timezone.now())
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE
    return lease


def suspend(client, lease):
    return client.post("/admin/rental/lease/", {"action": "suspend_now", "_selected_action": [lease.pk],
                                                "post": "yes", "reason": "abuse report"})


def test_viewing_leases_does_not_allow_suspending_them(client, clerk, operator, active_lease):
    client.force_login(grant(clerk, "rental.view_lease"))
    page = client.get("/admin/rental/lease/")
    assert page.status_code == 200 and "suspend_now" not in page.content.decode()
    assert suspend(client, active_lease).status_code in (200, 302)
    active_lease.refresh_from_db()
    assert active_lease.state == LeaseState.ACTIVE and not LeaseEvent.objects.filter(kind="suspended").exists()

    client.force_login(operator)  # the same request from someone allowed to change leases
    assert suspend(client, active_lease).status_code == 302
    active_lease.refresh_from_db()
    assert active_lease.state == LeaseState.SUSPENDED

"""Every admin action and every ops view declares the permission it needs,
never a view permission for a write. Generic on purpose: the walkers read
admin.site._registry and the admin site's URLs at run time, so a ModelAdmin, an action or
an ops view added later (by any app) is covered without touching this file."""
import pytest
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission
from django.test import RequestFactory
from django.urls import URLPattern, URLResolver, reverse
from django.utils import timezone

from billing.models import LedgerEntry, PaymentReview
from fleet.models import EnrolmentCode, NodeAgent
from fleet.services import enrolment_code_create, node_enrol
from inventory.models import Node
from rental.permissions import OpsPermissions, is_view_permission
from tests.fleet.conftest import FakeNode
from tests.otp import authenticator_for
from tests.security.helpers import grant

pytestmark = pytest.mark.django_db

# The admin site's own pages (sign-in, the index, the user's own password): not ops views.
SITE_VIEWS = {"index", "login", "logout", "password_change", "password_change_done", "autocomplete", "jsi18n",
              "app_list", "view_on_site"}


def registered():
    return sorted(admin.site._registry.items(), key=lambda item: item[0]._meta.label)


def base_actions(model_admin):
    """(name, function) of every action the admin offers: its own and the site-wide ones."""
    return [(name, func) for func, name, _description in model_admin._get_base_actions()]


def test_every_admin_action_declares_a_permission_that_is_not_view():
    undeclared = []
    for model, model_admin in registered():
        for name, func in base_actions(model_admin):
            perms = set(getattr(func, "allowed_permissions", ()))
            if not perms or perms <= {"view"}:
                undeclared.append(f"{model._meta.label}.{name}: {sorted(perms) or 'no permissions'}")
            for perm in perms:
                assert callable(getattr(model_admin, f"has_{perm}_permission", None)), (model, name, perm)
    assert undeclared == [], "admin actions must declare a write permission:\n" + "\n".join(undeclared)


def every_view_permission():
    return Permission.objects.filter(codename__startswith="view_")


@pytest.fixture
def viewer(django_user_model):
    """Staff who may look at everything and change nothing (all view permissions, 2FA)."""
    user = django_user_model.objects.create_user(username="viewer", password="viewer pass 12345", is_staff=True)
    user.user_permissions.set(every_view_permission())
    authenticator_for(user)
    return django_user_model.objects.get(pk=user.pk)


def as_request(user, method="get"):
    request = getattr(RequestFactory(), method)("/admin/")
    request.user = user
    return request


def test_staff_with_every_view_permission_are_offered_no_action(viewer):
    offered = {model._meta.label: sorted(model_admin.get_actions(as_request(viewer)))
               for model, model_admin in registered()}
    assert {label: names for label, names in offered.items() if names} == {}


def test_a_superuser_is_offered_every_action_an_admin_lists(admin_user):
    """The permissions declared are reachable: none hides its action from everyone (a
    read-only admin's has_change_permission is False, so its actions use 'operate')."""
    for model, model_admin in registered():
        offered = model_admin.get_actions(as_request(admin_user))
        missing = [name for name in (model_admin.actions or ()) if (name if isinstance(name, str)
                                                                    else name.__name__) not in offered]
        assert missing == [], model._meta.label


def walk(patterns, prefix=""):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from walk(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry


def django_own(callback) -> bool:
    """A view Django itself ships (a ModelAdmin's changelist/change/…, UserAdmin's password
    page): those check the has_<x>_permission methods themselves."""
    inner = callback
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__
    return getattr(inner, "__module__", "").startswith("django.")


def ops_patterns():
    """Every admin URL that is neither one of Django's own admin views nor the site's own."""
    found = []
    for route, entry in walk(admin.site.get_urls()):
        if (hasattr(entry.callback, "model_admin") and django_own(entry.callback)) or entry.name in SITE_VIEWS \
                or django_own(entry.callback):
            continue
        found.append((route, entry))
    return found


def test_every_ops_view_declares_its_permissions():
    patterns = ops_patterns()
    assert {entry.name for _route, entry in patterns} >= {"ops_dashboard", "ops_exports", "ops_holds",
                                                         "ops_customers", "ops_customer"}
    for route, entry in patterns:
        declared = getattr(entry.callback, "ops_permissions", None)
        assert isinstance(declared, OpsPermissions), f"/admin/{route} ({entry.name}) declares no permissions"
        assert declared.read, route
        assert declared.write is None or not is_view_permission(declared.write), route


def fill(route: str) -> str:
    """A concrete path for an admin route: '1' for every converter."""
    import re

    return "/admin/" + re.sub(r"<(?:\w+:)?\w+>", "1", route)


def test_staff_with_every_view_permission_cannot_post_to_any_ops_view(client, viewer, customer):
    from tests.otp import TwoFactorClient

    browser = TwoFactorClient()
    browser.force_login(viewer)
    entries = LedgerEntry.objects.count()
    for route, _entry in ops_patterns():
        path = fill(route).replace("/1/", f"/{customer.pk}/")
        response = browser.post(path, {"action": "adjust", "adjust-amount": "1000", "adjust-reason": "x"})
        assert response.status_code in (403, 405), (path, response.status_code)
    assert LedgerEntry.objects.count() == entries


# --- the cases the attack used ------------------------------------------------------------------

@pytest.fixture
def staff(django_user_model):
    user = django_user_model.objects.create_user(username="clerk", password="clerk pass 12345", is_staff=True)
    authenticator_for(user)
    return user


def two_factor_client(user):
    from tests.otp import TwoFactorClient

    browser = TwoFactorClient()
    browser.force_login(user)
    return browser


@pytest.fixture
def review(alices):
    return PaymentReview.objects.create(key="t-1", quote=alices["quote"], kind=PaymentReview.Kind.OVER_CAP,
                                        amount=10**8, proposed_cents=100_000, created_at=timezone.now())


def test_credit_reviews_needs_more_than_the_view_permission(staff, review, customer):
    url = reverse("admin:billing_paymentreview_changelist")
    form = {"action": "credit_reviews", ACTION_CHECKBOX_NAME: [review.pk], "post": "yes", "confirm": "on"}
    viewer = two_factor_client(grant(staff, "billing.view_paymentreview"))
    assert viewer.get(url).status_code == 200
    assert "credit_reviews" not in viewer.get(url).content.decode()
    viewer.post(url, form)
    viewer.post(url, {**form, "action": "close_reviews", "reason": "no"})
    review.refresh_from_db()
    assert review.state == PaymentReview.State.OPEN and not LedgerEntry.objects.filter(
        account__customer=customer, amount_cents=100_000).exists()
    operator = two_factor_client(grant(staff, "billing.change_paymentreview"))
    operator.post(url, form)
    review.refresh_from_db()
    assert review.state == PaymentReview.State.CREDITED


@pytest.fixture
def node(catalog):
    return Node.objects.first()


def test_minting_an_enrolment_code_or_revoking_needs_more_than_viewing_nodes(staff, node):
    url = reverse("admin:inventory_node_changelist")
    viewer = two_factor_client(grant(staff, "inventory.view_node", "fleet.view_nodeagent"))
    page = viewer.post(url, {"action": "enrolment_code", ACTION_CHECKBOX_NAME: [node.pk]})
    assert page.status_code in (200, 302) and not EnrolmentCode.objects.exists()
    code = enrolment_code_create(node=node, actor=None, now=timezone.now())
    node_enrol(code=code, public_key=FakeNode(node, None).public_key, agent_version="1", hostname="h",
               now=timezone.now())
    viewer.post(url, {"action": "revoke_credential", ACTION_CHECKBOX_NAME: [node.pk]})
    assert NodeAgent.objects.get(node=node).credential_hash is not None
    # The node's change permission alone is not enough either: the agent's is needed too.
    changer = two_factor_client(grant(staff, "inventory.change_node"))
    changer.post(url, {"action": "revoke_credential", ACTION_CHECKBOX_NAME: [node.pk]})
    assert NodeAgent.objects.get(node=node).credential_hash is not None
    operator = two_factor_client(grant(staff, "fleet.change_nodeagent"))
    page = operator.post(url, {"action": "enrolment_code", ACTION_CHECKBOX_NAME: [node.pk]})
    assert page.status_code == 200 and EnrolmentCode.objects.filter(used_at__isnull=True).count() == 1
    operator.post(url, {"action": "revoke_credential", ACTION_CHECKBOX_NAME: [node.pk]})
    assert NodeAgent.objects.get(node=node).credential_hash is None


def test_an_authenticators_secret_is_not_shown_to_staff_who_may_only_view_devices(staff, admin_user):
    device = authenticator_for(admin_user)
    viewer = two_factor_client(grant(staff, "otp_totp.view_totpdevice"))
    for name in ("otp_totp_totpdevice_config", "otp_totp_totpdevice_qrcode"):
        assert viewer.get(reverse(f"admin:{name}", args=[device.pk])).status_code == 403, name
    operator = two_factor_client(grant(staff, "otp_totp.change_totpdevice"))
    assert operator.get(reverse("admin:otp_totp_totpdevice_config", args=[device.pk])).status_code == 200

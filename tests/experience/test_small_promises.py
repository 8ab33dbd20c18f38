"""The customer's smaller promises: the demo store's 404 is the site's own page in the reader's
language; a favicon; invoice lines in the reader's language whatever the order's; the
operator sees a lease's node and GPU slots and a node's leases, and the incident form's
constraint error as a sentence; /storage/ says "up to 30 TB per node" once."""
import pytest
from django.urls import reverse

from tests.experience.scenes import node_of, running_lease
from tests.factories import place
from tests.i18n.conftest import ZH

FRIENDLY = "storefront.middleware.FriendlyNotFoundMiddleware"


@pytest.fixture
def op_client(client, operator):
    client.force_login(operator)
    return client


def test_the_demo_stores_404_is_the_sites_own_page(rf, customer):
    from django.http import HttpResponse, JsonResponse
    from django.utils import translation

    from storefront.middleware import FriendlyNotFoundMiddleware

    debug_page = HttpResponse(b"<html><head><title>Page not found at /x/</title></head>Using the URLconf", status=404)
    request = rf.get("/x/")
    request.user = customer
    with translation.override("zh-hans"):
        response = FriendlyNotFoundMiddleware(lambda r: debug_page)(request)
    body = response.content.decode()
    assert response.status_code == 404 and "页面不存在" in body and "URLconf" not in body
    api = JsonResponse({"error": "not_found"}, status=404)  # the API's own 404 is left alone
    assert FriendlyNotFoundMiddleware(lambda r: api)(request) is api


def test_make_run_installs_it_only_with_debug():
    import subprocess
    import sys

    code = "import django, os; django.setup(); from django.conf import settings; print('{}' in settings.MIDDLEWARE)"
    env = {"DJANGO_SETTINGS_MODULE": "storefront.settings", "PATH": "/usr/bin:/bin"}
    on = subprocess.run([sys.executable, "-c", code.format(FRIENDLY)], env={**env, "DEBUG": "1"},
                        capture_output=True, text=True, timeout=60)
    assert on.stdout.strip() == "True", on.stderr


def test_favicon_is_linked_and_served(client, catalog):
    page = client.get(reverse("home")).content.decode()
    assert '<link rel="icon" href="/static/favicon.svg"' in page
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"


def test_invoice_lines_in_the_readers_language(client, catalog, customer):
    from django.utils import translation

    with translation.override("zh-hans"):  # ordered by a customer browsing in Chinese
        _lease, invoice = place(customer)
    assert invoice.lines.first().description == "RTX 3090, 1 week (7 days)"  # stored in English
    client.force_login(customer)
    en = client.get(reverse("billing:invoice", args=[invoice.pk]), HTTP_ACCEPT_LANGUAGE="en").content.decode()
    zh = client.get(reverse("billing:invoice", args=[invoice.pk]), **ZH).content.decode()
    assert "<td>RTX 3090, 1 week (7 days)</td>" in en and "<td>RTX 3090，1 周（7 天）</td>" in zh


def test_admin_lease_shows_its_node_and_slots_and_the_node_its_leases(op_client, catalog, customer, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    lease = running_lease(customer)
    node = node_of(lease)
    lease_page = op_client.get(reverse("admin:rental_lease_change", args=[lease.pk])).content.decode()
    assert f'<a href="{reverse("admin:inventory_node_change", args=[node.pk])}">{node.name}</a>: gpu' in lease_page
    node_page = op_client.get(reverse("admin:inventory_node_change", args=[node.pk])).content.decode()
    assert f'<a href="{reverse("admin:rental_lease_change", args=[lease.pk])}">#{lease.pk}</a> (gpu' in node_page


def test_incident_form_says_the_constraint_in_words(op_client, catalog):
    response = op_client.post(reverse("admin:inventory_incident_add"), {
        "kind": "down", "starts_at_0": "2026-01-01", "starts_at_1": "10:00:00", "reason": "PSU"})
    body = response.content.decode()
    assert response.status_code == 200 and "Pick exactly one of site, node or GPU slot." in body
    assert "is violated" not in body


def test_storage_page_says_the_node_limit_once(client, catalog):
    assert client.get(reverse("storage")).content.decode().count("up to 30 TB per node") == 1


def test_the_link_filter_names_only_cards_on_sale(client, catalog):
    from inventory.forms import CatalogFilterForm
    from inventory.models import GpuModel, Offer
    from inventory.selectors import catalog_changed

    labels = dict(CatalogFilterForm().fields["link"].choices)
    assert labels["pcie-p2p"] == "PCIe Gen4 peer-to-peer — L40S"  # the link table also names RTX 6000 Ada and L4
    assert labels["pcie"] == "PCIe, no NVLink — RTX 4090"  # and RTX 5090
    assert labels["nvlink-nvswitch-900"] == "NVLink + NVSwitch — H100 SXM, H200 SXM"
    sold = set(GpuModel.objects.filter(offers__is_active=True).values_list("name", flat=True))
    named = {card for label in list(labels.values())[1:] for card in label.split(" — ", 1)[1].split(", ")}
    assert named == sold
    Offer.objects.filter(gpu_model__slug="h200-sxm").update(is_active=False)  # withdrawn: no longer named
    catalog_changed()
    assert dict(CatalogFilterForm().fields["link"].choices)["nvlink-nvswitch-900"] == "NVLink + NVSwitch — H100 SXM"


def test_a_pasted_key_is_saved_only_when_asked(client, catalog, customer, settings):
    from inventory.models import AuditEntry
    from rental.models import Lease, SshKey
    from tests.factories import ED25519, form_data, order_url

    settings.MAX_OPEN_UNPAID_ORDERS = 4  # four orders left unpaid here
    client.force_login(customer)
    page = client.get(order_url()).content.decode()
    assert 'name="save_key"' in page and 'name="save_key" checked' not in page  # offered, off by default
    assert client.post(order_url(), form_data()).status_code == 302
    assert Lease.objects.count() == 1 and not SshKey.objects.exists()  # not ticked: the account is unchanged

    response = client.post(order_url(), form_data(save_key="on"), follow=True)
    key = SshKey.objects.get(customer=customer)
    assert Lease.objects.count() == 2 and key.name == "alice@laptop" and key.public_key == ED25519
    assert AuditEntry.objects.filter(action="ssh_key_add", object_id=str(key.pk)).exists()
    assert "SSH key “alice@laptop” saved to your account for later orders." in response.content.decode()

    # Ticked again for a key saved already: the order stands and the customer is told why.
    response = client.post(order_url(), form_data(save_key="on"), follow=True)
    assert Lease.objects.count() == 3 and SshKey.objects.count() == 1
    assert "The key was not saved to your account: This key is saved already." in response.content.decode()
    # Choosing the saved key (nothing pasted) and ticking the box saves nothing and says nothing.
    response = client.post(order_url(), form_data(ssh_public_key="", saved_key=key.pk, save_key="on"), follow=True)
    assert Lease.objects.count() == 4 and "not saved" not in response.content.decode()


def test_a_pasted_key_without_a_comment_is_saved_under_its_lease(client, catalog, customer):
    from rental.models import Lease, SshKey
    from tests.factories import ED25519, form_data, order_url

    client.force_login(customer)
    bare = ED25519.rsplit(" ", 1)[0]
    assert client.post(order_url(), form_data(ssh_public_key=bare, save_key="on")).status_code == 302
    assert SshKey.objects.get().name == f"lease-{Lease.objects.get().pk}"


def test_reloaded_secret_pages_say_so_in_the_readers_language(client, customer):
    from rental.models import ApiToken

    client.force_login(customer)
    created = client.post(reverse("token_create"), {"name": "ci"})
    assert created.status_code == 302 and created["Location"] == reverse("account_settings") + "#tokens"
    first = client.get(reverse("account_settings")).content.decode()
    again = client.get(reverse("account_settings")).content.decode()
    assert 'id="new-token"' in first and 'id="new-token"' not in again and ApiToken.objects.count() == 1
    zh = client.get(reverse("recovery_codes_show"), **ZH).content.decode()  # nothing kept: a reload
    assert "这些恢复码只显示一次" in zh and "<li><code>" not in zh
    evil = client.get(reverse("recovery_codes_show"), {"next": "https://evil.example/"}).content.decode()
    assert 'href="https://evil.example/' not in evil and f'href="{reverse("home")}"' in evil  # not followed off-site

"""My leases, the lease page, settings, API tokens and notifications; SSH key validation."""
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from billing.services import balance_top_up, checkout_place_order
from inventory.models import Offer, Site
from ops.lifecycle import run_lifecycle
from rental.accounts.services import api_token_authenticate, token_hash
from rental.models import ApiToken, Image, LeaseEvent, Notification
from rental.timeline import countdown
from rental.validators import validate_ssh_public_key

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq4Yg3Yd6n3Zl9k1X2J0m3w9mRrV0Xq8bX9bUZf3m1P alice@laptop"
ECDSA = ("ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBESzUbAv36u5Uep0OXAUhvHFy7vVUf1mB/"
         "6Q36DwVb9Uk6UaXiKSTJkrWm+O6sGrTVJj3KgM727N8rFmx5PE5dg= me@box")
RSA_2048 = ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQDhf8zZ4ZDzwcI/s0CwiMZ9D0saukZYEQhZos8UTHpjEMqFG4eB+jmhgGIr/FmRvble12M"
            "M9P5/0IQ4eT1n7+kAzpVSjrOZ6kehtjfgd3ImQhJO+va23On9pL1xOohYRBy2DPotCuNvVlg/5fWJQHaeZBXqqq9X15CMh5gV5UM9ONgDr6y"
            "WL37jB5noA00RQNL3uUO08SKO0qIM7Y5H6XdODbqriDcIEL07xRud6nWLsqFPRkydUDaSPmO0Ucnx2cnUe/lH0HZtS2ht7UXYf0t30WfHbA3h"
            "5R3zxtCQ3/urhTgFIvBCc7IaOy40c0Ro4gl+0co4qjtG7SygdvkKwZV3 rsa@box")


def place(customer, *, pay=False, term="week"):
    return checkout_place_order(customer=customer, offer=Offer.objects.get(slug="rtx-3090"),
                                site=Site.objects.get(code="DFW-1"), term=term,
                                image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=ED25519,
                                pay_from_balance=pay)


# --- validators and countdowns ----------------------------------------------------------------

@pytest.mark.parametrize("key", [ED25519, ECDSA, RSA_2048, "  " + ED25519.replace(" ", "\n", 1) + "\n"])
def test_good_ssh_keys_are_accepted_and_normalised(key):
    assert "\n" not in validate_ssh_public_key(key)


@pytest.mark.parametrize("key", ["", "ssh-ed25519", "ssh-ed25519 AAAA", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAAQ==",
                                 ED25519.replace("ssh-ed25519", "ecdsa-sha2-nistp256"), "x" * 20_000])
def test_bad_ssh_keys_are_refused(key):
    with pytest.raises(ValidationError):
        validate_ssh_public_key(key)


def test_countdown_wording():
    now = timezone.now()
    assert countdown(now + timedelta(days=3, hours=4, minutes=5), now) == "in 3 d 4 h"
    assert countdown(now + timedelta(minutes=25, seconds=5), now) == "in 25 min"
    assert countdown(now - timedelta(hours=2, minutes=1), now) == "2 h 1 min ago"


# --- pages ------------------------------------------------------------------------------------

def test_customer_pages_need_login(client, db):
    for name in ("lease_list", "account_settings", "billing:invoices", "billing:balance"):
        response = client.get(reverse(name))
        assert response.status_code == 302 and reverse("login") in response["Location"]


def test_empty_leases_page_points_to_sizing_and_catalog(client, customer):
    client.force_login(customer)
    html = client.get(reverse("lease_list")).content.decode()
    assert "No leases yet — size your job" in html and reverse("catalog") in html


def test_leases_list_shows_state_and_countdowns(client, catalog, customer, django_assert_max_num_queries):
    balance_top_up(customer=customer, amount_cents=20_000, now=timezone.now())
    place(customer, pay=True)
    place(customer)
    client.force_login(customer)
    with django_assert_max_num_queries(8):  # no N+1 over leases
        html = client.get(reverse("lease_list")).content.decode()
    assert "provisioning" in html and "pending payment" in html
    assert "Payment window closes: <span class=\"countdown\"" in html and "in 29 min" in html
    assert "in 4 d 0 h" in html  # the 3-day reminder of the paid week, its term projected from now


def test_lease_page_owner_200_other_404(client, catalog, customer, other_customer):
    lease, invoice = place(customer)
    client.force_login(customer)
    html = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert "<svg" in html and "Waiting for payment" in html and f"#{invoice.pk}" in html
    assert "Order placed" in html  # the events list, in words
    client.force_login(other_customer)
    assert client.get(reverse("lease_detail", args=[lease.pk])).status_code == 404
    assert client.get(reverse("lease_detail", args=[lease.pk]), HTTP_HX_REQUEST="true").status_code == 404


def test_lease_page_active_shows_ssh_line_and_now_marker(client, catalog, customer, settings):
    settings.HOST_AGENT_FAKE_DELAY = 0
    balance_top_up(customer=customer, amount_cents=20_000, now=timezone.now())
    lease, _ = place(customer, pay=True)
    run_lifecycle(timezone.now() + timedelta(seconds=1))
    client.force_login(customer)
    html = client.get(reverse("lease_detail", args=[lease.pk])).content.decode()
    assert f"ssh -p {22000 + lease.pk} root@lease-{lease.pk}.gpu.local" in html
    assert 'class="tl-now"' in html and 'hx-trigger="every 3s"' not in html


def test_settings_update_email_and_auto_renew(client, customer):
    client.force_login(customer)
    assert client.get(reverse("account_settings")).status_code == 200
    response = client.post(reverse("account_settings"), {"email": ""})
    customer.refresh_from_db()
    assert response.status_code == 302 and customer.email == "" and not customer.rental_settings.auto_renew
    assert client.post(reverse("account_settings"), {"email": "nope"}).status_code == 400


def test_api_token_shown_once_hashed_and_revocable(client, customer, other_customer):
    client.force_login(customer)
    html = client.post(reverse("token_create"), {"name": "cluster"}, follow=True).content.decode()
    token = ApiToken.objects.get()
    raw = html.split('value="gpr_', 1)[1].split('"', 1)[0]
    raw = "gpr_" + raw
    assert token.token_hash == token_hash(raw) and raw.startswith("gpr_" + token.prefix) and len(token.prefix) == 8
    assert raw not in client.get(reverse("account_settings")).content.decode()
    assert api_token_authenticate(raw).customer == customer
    client.force_login(other_customer)
    assert client.post(reverse("token_revoke", args=[token.pk])).status_code == 404
    client.force_login(customer)
    assert client.post(reverse("token_revoke", args=[token.pk])).status_code == 302
    assert api_token_authenticate(raw) is None


def test_notifications_list_and_mark_read(client, catalog, customer, other_customer):
    lease, _ = place(customer)
    note = Notification.objects.create(lease=lease, customer=customer, kind="reminder_3d", deadline=timezone.now(),
                                       subject="Lease ends soon", body="3 days left")
    client.force_login(other_customer)
    client.post(reverse("notification_read", args=[note.pk]))
    note.refresh_from_db()
    assert note.read_at is None
    client.force_login(customer)
    assert "Lease ends soon" in client.get(reverse("account_settings")).content.decode()
    client.post(reverse("notification_read", args=[note.pk]))
    note.refresh_from_db()
    assert note.read_at is not None


def test_nav_links_for_logged_in_users(client, customer):
    client.force_login(customer)
    html = client.get(reverse("home")).content.decode()
    assert reverse("lease_list") in html and reverse("billing:balance") in html


def test_the_lease_page_reads_the_leases_events_once_for_every_part_that_shows_them(
        client, catalog, customer):
    """The events list, the move to other hardware, "in progress", the server key fingerprints
    and the sanitization record all look at the lease's events: one read serves them all, and
    the disk key comes with the lease."""
    lease, _ = place(customer)
    now = timezone.now()
    LeaseEvent.objects.bulk_create([
        LeaseEvent(lease=lease, at=now - timedelta(hours=3), kind="provisioned",
                   data={"node_key_fingerprint": "SHA256:first-server"}),
        LeaseEvent(lease=lease, at=now - timedelta(hours=2), kind="migrated", data={"seconds": 180}),
        LeaseEvent(lease=lease, at=now - timedelta(hours=2), kind="connection_changed",
                   data={"node_key_fingerprint": "SHA256:second-server"}),
        LeaseEvent(lease=lease, at=now - timedelta(days=8), kind="migrated", data={"seconds": 60}),
    ])
    client.force_login(customer)
    url = reverse("lease_detail", args=[lease.pk])
    with CaptureQueriesContext(connection) as queries:
        html = client.get(url).content.decode()
    reads = [q["sql"] for q in queries.captured_queries]
    assert sum('FROM "rental_leaseevent"' in sql for sql in reads) == 1
    assert not any('FROM "rental_diskkey"' in sql for sql in reads)
    assert "SHA256:second-server" in html and 'id="migration-note"' in html and "3 minutes after" in html
    assert 'hx-trigger="every 3s"' in html     # still waiting for payment

    LeaseEvent.objects.filter(lease=lease, kind="migrated", at__gte=now - timedelta(days=7)).delete()
    html = client.get(url).content.decode()
    assert 'id="migration-note"' not in html    # the one left is older than the week it is shown

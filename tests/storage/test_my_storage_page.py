"""The customer's storage page (/storage/mine/): order, attach, detach, snapshot, restore and
delete for the owner; refusals shown as messages (short balance, wrong site or region);
other customers' objects are 404; the page in Chinese has no English catalog string."""
import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Account
from billing.services import balance_top_up
from inventory.models import Site
from rental.models import NetworkVolume, Snapshot, VolumeAttachment
from storage.charges import snapshot_order, volume_order
from storage.models import SnapshotMeter
from tests.factories import KEY
from tests.i18n.conftest import ZH, assert_chinese

INDEX = "storage_mine:index"


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def alice(client, customer):
    client.force_login(customer)
    return client


@pytest.fixture
def place(settings):
    """An active lease, paid from a top-up of its exact price."""
    from billing.services import checkout_place_order, price_lines
    from inventory.models import Offer
    from rental.lifecycle import sweep_provisioning
    from rental.models import Image

    settings.HOST_AGENT_FAKE_DELAY = 0

    def _place(customer, at, *, offer="rtx-3090", site="DFW-1"):
        offer = Offer.objects.get(slug=offer)
        balance_top_up(customer=customer, amount_cents=sum(
            line.amount_cents for line in price_lines(offer=offer, term="month", addons={})), now=at)
        lease, _invoice = checkout_place_order(
            customer=customer, offer=offer, site=Site.objects.get(code=site), term="month",
            image=Image.objects.get(slug="pytorch-2.5-cuda-12.4"), ssh_public_key=KEY, addons={},
            pay_from_balance=True, now=at)
        sweep_provisioning(at)
        lease.refresh_from_db()
        assert lease.state == "active"
        return lease

    return _place


def balance(c):
    return Account.objects.get(customer=c).balance_cents


def msgs(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def volume(customer, now, site="DFW-1", size=1):
    balance_top_up(customer=customer, amount_cents=1400 * size, now=now)
    return volume_order(customer=customer, site=Site.objects.get(code=site), name="data", size_tb=size, now=now)


def test_login_required_and_empty_states(client, catalog, customer):
    response = client.get(reverse(INDEX))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    client.force_login(customer)
    page = client.get(reverse(INDEX)).content.decode()
    assert "No network volumes yet" in page and "No snapshots yet" in page
    assert "You have no active or suspended lease to snapshot." in page
    assert reverse(INDEX) in client.get(reverse("lease_list")).content.decode()  # the nav link


def test_order_a_volume_from_the_balance(alice, catalog, customer, now):
    balance_top_up(customer=customer, amount_cents=3000, now=now)
    response = alice.post(reverse("storage_mine:volume_create"),
                          {"site": "DFW-1", "size_tb": 2, "name": "datasets"}, follow=True)
    vol = NetworkVolume.objects.get(customer=customer)
    assert (vol.name, vol.size_tb, vol.site.code) == ("datasets", 2, "DFW-1") and balance(customer) == 200
    assert any("datasets" in m and "ordered" in m for m in msgs(response))
    page = response.content.decode()
    assert "datasets" in page and "DFW-1" in page and vol.paid_until.strftime("%Y-%m-%d") in page


def test_short_balance_is_a_message_linking_to_the_top_up(alice, catalog, customer):
    response = alice.post(reverse("storage_mine:volume_create"), {"site": "DFW-1", "size_tb": 2, "name": "x"})
    assert response.status_code == 400 and not NetworkVolume.objects.exists()
    text = response.content.decode()
    assert "does not cover" in text and f'href="{reverse("billing:balance")}"' in text


@pytest.mark.parametrize("size", ["0", "101", "abc"])
def test_bad_size_is_a_form_error(alice, catalog, customer, size):
    response = alice.post(reverse("storage_mine:volume_create"), {"site": "DFW-1", "size_tb": size, "name": "x"})
    assert response.status_code == 400 and not NetworkVolume.objects.exists()


def test_attach_and_detach(alice, catalog, customer, place, now):
    a = place(customer, now)
    vol = volume(customer, now)
    page = alice.get(reverse(INDEX)).content.decode()
    assert f'action="{reverse("storage_mine:volume_attach", args=[vol.pk])}"' in page
    response = alice.post(reverse("storage_mine:volume_attach", args=[vol.pk]), {"lease": a.pk}, follow=True)
    assert VolumeAttachment.objects.filter(volume=vol, lease=a, detached_at__isnull=True).exists()
    assert any("attached" in m for m in msgs(response))
    response = alice.post(reverse("storage_mine:volume_detach", args=[vol.pk, a.pk]), follow=True)
    assert not VolumeAttachment.objects.filter(volume=vol, detached_at__isnull=True).exists()
    assert any("detached" in m for m in msgs(response))
    response = alice.post(reverse("storage_mine:volume_detach", args=[vol.pk, a.pk]), follow=True)
    assert any("not attached" in m for m in msgs(response))


def test_attach_at_another_site_is_refused(alice, catalog, customer, place, now):
    elsewhere = place(customer, now, site="IAD-1")
    vol = volume(customer, now)
    response = alice.post(reverse("storage_mine:volume_attach", args=[vol.pk]), {"lease": elsewhere.pk}, follow=True)
    assert response.status_code == 200 and not VolumeAttachment.objects.exists()
    assert any("only to leases at its own site" in m for m in msgs(response))


def test_snapshot_take_then_restore_from_the_lease_page(alice, catalog, customer, place, now):
    a100 = place(customer, now, offer="a100-sxm")
    same_site = place(customer, now, offer="a100-sxm")
    elsewhere = place(customer, now, offer="h100-sxm", site="PDX-1")
    response = alice.post(reverse("storage_mine:snapshot_create"), {"lease": a100.pk, "size_tb": 1}, follow=True)
    snap = Snapshot.objects.get(customer=customer)
    assert snap.source_lease_id == a100.pk and balance(customer) == 0  # nothing up front: billed by what it stores
    assert any("taken" in m and "billed for what it stores" in m for m in msgs(response))

    # My storage keeps the lease page's rule (its own site, the instance stopped) and sends the
    # customer there: it restores nothing itself.
    page = alice.get(reverse(INDEX)).content.decode()
    row = page[page.index(f'id="snapshot-{snap.pk}"'):]
    row = row[:row.index("</tr>")]
    for lease in (a100, same_site):
        assert reverse("lease_detail", args=[lease.pk]) + "#instance" in row
    assert reverse("lease_detail", args=[elsewhere.pk]) not in row and "<form" not in row.split("Delete")[0]

    # Running: the lease page offers no restore. Stopped: it offers the snapshot, asks for the box,
    # and (storage simulated, as on the demo) the disk is restored at once.
    lease_page = reverse("lease_detail", args=[same_site.pk])
    assert 'id="restore-form"' not in alice.get(lease_page).content.decode()
    alice.post(reverse("instance_action", args=[same_site.pk, "stop"]))
    assert f'<option value="{snap.pk}">' in alice.get(lease_page).content.decode()
    restore = reverse("instance_restore", args=[same_site.pk])
    response = alice.post(restore, {"snapshot": snap.pk}, follow=True)
    assert any("Tick the box" in m for m in msgs(response))
    assert not same_site.events.filter(kind="snapshot_restored").exists()
    alice.post(restore, {"snapshot": snap.pk, "confirm": "yes"})
    assert same_site.events.filter(kind="snapshot_restored").count() == 1
    alice.post(reverse("instance_action", args=[elsewhere.pk, "stop"]))
    assert f'<option value="{snap.pk}">' not in alice.get(reverse("lease_detail", args=[elsewhere.pk])).content.decode()
    response = alice.post(reverse("instance_restore", args=[elsewhere.pk]), {"snapshot": snap.pk, "confirm": "yes"},
                          follow=True)
    assert any("stored at DFW-1" in m for m in msgs(response))
    assert not elsewhere.events.filter(kind="snapshot_restored").exists()

    SnapshotMeter.objects.create(snapshot=snap, accrues_from=now, billed_until=now, unpaid_since=now)
    response = alice.post(reverse("storage_mine:snapshot_create"), {"lease": a100.pk, "size_tb": 1})
    assert response.status_code == 400 and "unpaid" in response.content.decode()  # a snapshot's bill is not covered
    assert Snapshot.objects.filter(customer=customer).count() == 1


def test_delete_asks_first(alice, catalog, customer, place, now):
    a = place(customer, now)
    vol = volume(customer, now)
    balance_top_up(customer=customer, amount_cents=600, now=now)
    snap = snapshot_order(lease=a, size_tb=1, now=now)
    for obj, name in ((vol, "volume_delete"), (snap, "snapshot_delete")):
        url = reverse(f"storage_mine:{name}", args=[obj.pk])
        confirm = alice.get(url)
        assert confirm.status_code == 200 and "Delete for good" in confirm.content.decode()
        obj.refresh_from_db()
        assert obj.state != "deleted"
        response = alice.post(url, follow=True)
        obj.refresh_from_db()
        assert obj.state == "deleted" and any("deleted" in m for m in msgs(response))
        assert alice.get(url).status_code == 404  # gone from the page too
    page = alice.get(reverse(INDEX)).content.decode()
    assert "No network volumes yet" in page and "No snapshots yet" in page


def test_other_customers_objects_are_404(alice, catalog, customer, other_customer, place, now):
    mine = place(customer, now)
    theirs = place(other_customer, now)
    their_vol = volume(other_customer, now)
    balance_top_up(customer=other_customer, amount_cents=600, now=now)
    their_snap = snapshot_order(lease=theirs, size_tb=1, now=now)
    my_vol = volume(customer, now)
    balance_top_up(customer=customer, amount_cents=600, now=now)
    snapshot_order(lease=mine, size_tb=1, now=now)
    posts = [
        (reverse("storage_mine:volume_attach", args=[their_vol.pk]), {"lease": mine.pk}),
        (reverse("storage_mine:volume_attach", args=[my_vol.pk]), {"lease": theirs.pk}),
        (reverse("storage_mine:volume_detach", args=[their_vol.pk, theirs.pk]), {}),
        (reverse("storage_mine:volume_delete", args=[their_vol.pk]), {}),
        (reverse("storage_mine:snapshot_create"), {"lease": theirs.pk, "size_tb": 1}),
        (reverse("storage_mine:snapshot_delete", args=[their_snap.pk]), {}),
    ]
    for url, data in posts:
        assert alice.post(url, data).status_code == 404, url
    assert alice.get(reverse("storage_mine:volume_delete", args=[their_vol.pk])).status_code == 404
    their_vol.refresh_from_db()
    their_snap.refresh_from_db()
    assert their_vol.state == "active" and their_snap.state == "available"
    assert not VolumeAttachment.objects.exists() and Snapshot.objects.count() == 2
    page = alice.get(reverse(INDEX)).content.decode()
    assert f"volume-{their_vol.pk}\"" not in page and f"snapshot-{their_snap.pk}\"" not in page


def test_page_in_chinese(alice, catalog, customer, place, now, settings):
    settings.LANGUAGE_CODE = "en"
    url = reverse(INDEX)
    assert_chinese(alice.get(url, **ZH), url)  # empty states
    a = place(customer, now)
    vol = volume(customer, now)
    balance_top_up(customer=customer, amount_cents=600, now=now)
    snap = snapshot_order(lease=a, size_tb=1, now=now)
    alice.post(reverse("storage_mine:volume_attach", args=[vol.pk]), {"lease": a.pk}, **ZH)
    assert_chinese(alice.get(url, **ZH), url)  # tables, forms and the message
    for name, obj in (("volume_delete", vol), ("snapshot_delete", snap)):
        confirm = reverse(f"storage_mine:{name}", args=[obj.pk])
        assert_chinese(alice.get(confirm, **ZH), confirm)
    response = alice.post(reverse("storage_mine:volume_create"), {"site": "DFW-1", "size_tb": 50, "name": "x"}, **ZH)
    assert response.status_code == 400
    assert_chinese(response, "short balance")

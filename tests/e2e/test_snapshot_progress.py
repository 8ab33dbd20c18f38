"""Snapshots in a real browser: while a snapshot is taken, the lease page shows its progress
and updates it by itself (htmx polls the live region; no reload), then shows it ready and
stops polling. The node's reports are the storefront services the agent endpoints call
(rental.storage.snapshot_progress / snapshot_ready); the node side is tests/storage. Without
JavaScript the page refreshes itself meanwhile (noscript meta refresh) and shows the same."""
import re

import pytest
from django.utils import timezone

from tests.e2e.conftest import login, ms, screenshot
from tests.e2e.helpers import _customer


def _active_lease(customer):
    from billing.services import balance_top_up, checkout_place_order
    from inventory.models import Offer, Site
    from rental.lifecycle import sweep_provisioning
    from rental.models import Image, Lease, LeaseState

    balance_top_up(customer=customer, amount_cents=900_000, now=timezone.now())
    offer, site = Offer.objects.get(slug="rtx-3090"), Site.objects.get(code="DFW-1")
    lease, _invoice = checkout_place_order(
        customer=customer, offer=offer, site=site, term="week", image=Image.objects.filter(vendor="nvidia").first(),
        ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC0FpbGmAodSM8zcXsymaWbQuYjSezzZsRDuhJOvzk3F alice",
        pay_from_balance=True, now=timezone.now())
    sweep_provisioning(timezone.now())
    lease.refresh_from_db()
    assert lease.state == LeaseState.ACTIVE, lease.state
    return Lease.objects.get(pk=lease.pk)


def _taking(lease):
    from rental.models import Snapshot

    now = timezone.now()
    return Snapshot.objects.create(customer=lease.customer, source_lease=lease, region=lease.site.region,
                                   site=lease.site, size_tb=1, created_at=now, paid_until=now,
                                   state=Snapshot.State.CREATING, repository="s3:http://rgw.test/snap-e2e",
                                   rgw_uid="snap-e2e")


def _report(snap, done, total):
    from rental.storage import snapshot_progress

    assert snapshot_progress(snapshot_id=snap.pk, op_id=snap.op_id, now=timezone.now(), report={
        "state": "running", "bytes_done": done, "total_bytes": total, "percent": round(100 * done / total, 1)})


def _ready(snap):
    from rental.storage import snapshot_ready

    assert snapshot_ready(snapshot_id=snap.pk, op_id=snap.op_id, now=timezone.now(), facts={
        "restic_snapshot": "4f1c2b9e", "bytes": 4 * 10**9, "stored_bytes": 3 * 10**9})


@pytest.mark.parametrize("javascript", [True, False], ids=["htmx", "no-js"])
def test_the_lease_page_shows_a_snapshot_s_progress_then_ready(new_context, shop, javascript):
    customer = _customer(f"snapper{int(javascript)}")
    lease = _active_lease(customer)
    snap = _taking(lease)
    _report(snap, 2**30, 4 * 2**30)

    ctx = new_context(java_script_enabled=javascript)
    page = ctx.new_page()
    login(page, customer.username)
    loads = []
    page.goto(f"/leases/{lease.pk}/")
    page.on("load", lambda: loads.append(1))
    row = page.locator(f"#lease-snapshot-{snap.pk}")
    assert "being taken" in row.inner_text()
    assert row.locator("progress").get_attribute("value") == "25.0"
    screenshot(page, f"snapshot-progress-{'htmx' if javascript else 'nojs'}")

    _report(snap, 3 * 2**30, 4 * 2**30)
    # htmx swaps the region every 3 s; without JS the page refreshes itself every 10 s.
    page.wait_for_selector(f"#lease-snapshot-{snap.pk} progress[value='75.0']", timeout=ms(25))
    assert "75.0 %" in row.inner_text() and re.search(r"3\.0\s*GB\s*/\s*4\.0\s*GB", row.inner_text())
    if javascript:
        assert loads == []          # swapped in place, no reload

    _ready(snap)
    # (selectors, not wait_for_function: the site's CSP allows no eval)
    page.wait_for_selector(f"#lease-snapshot-{snap.pk}:has-text('ready')", timeout=ms(25))
    assert page.locator(f"#lease-snapshot-{snap.pk} progress").count() == 0
    text = row.inner_text()
    assert "ready" in text and "stored" in text
    if javascript:
        assert page.locator("#lease-live").get_attribute("hx-trigger") is None     # polling stopped
        assert loads == []
    else:
        assert loads                                                # the page refreshed itself meanwhile
        assert 'http-equiv="refresh"' not in page.content()         # and refreshes no more
    screenshot(page, f"snapshot-ready-{'htmx' if javascript else 'nojs'}")

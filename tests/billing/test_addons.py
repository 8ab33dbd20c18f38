"""Billing's extension point for add-ons delivered by an app above it (billing.addons): the
storage app registers the order page's network volume at start-up, and billing calls every
registered handler at its moments, adding up what they return."""
from datetime import UTC, datetime

from billing import addons
from storage.orders import ORDERED_VOLUME

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_storage_app_registers_the_ordered_volume():
    assert addons._handlers["ordered_volume"] is ORDERED_VOLUME


def test_every_registered_handler_is_called_and_their_amounts_add_up(monkeypatch):
    calls = []

    def handler(name, cents):
        return addons.AddonHandler(
            name=name, paid=lambda *, invoice, now: calls.append((name, invoice, now)),
            cancel=lambda *, lease, now: (cents, [f"{name}-invoice"]),
            pending_cents=lambda lease: cents, price_cents=lambda lease: 2 * cents)

    monkeypatch.setattr(addons, "_handlers", {})
    addons.addon_register(handler("a", 100))
    addons.addon_register(handler("b", 5))
    addons.addon_register(handler("b", 7))          # the same name again replaces it
    addons.order_paid(invoice="inv", now=NOW)
    assert calls == [("a", "inv", NOW), ("b", "inv", NOW)]
    assert addons.lease_cancel(lease="lease", now=NOW) == (107, ["a-invoice", "b-invoice"])
    assert addons.pending_cents("lease") == 107 and addons.price_cents("lease") == 214


def test_without_a_handler_an_order_has_no_addon(monkeypatch):
    monkeypatch.setattr(addons, "_handlers", {})
    addons.order_paid(invoice="inv", now=NOW)
    assert addons.lease_cancel(lease="lease", now=NOW) == (0, [])
    assert addons.pending_cents("lease") == 0 and addons.price_cents("lease") == 0

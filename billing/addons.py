"""Add-ons sold with a lease's order and delivered by an app above billing (today one: the
order page's network volume, storage.orders). Billing owns the moments they hang on (the
order invoice is paid, the lease is refunded, the price a renewal shows) but may not import
the apps above it, so each such app registers a handler here in its AppConfig.ready() and
billing calls every registered one (ADR 0025). With none registered an order has no add-on."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rental.models import Lease

    from .models import Invoice


@dataclass(frozen=True)
class AddonHandler:
    name: str
    #: the order invoice was paid and its lease started: deliver the add-on (once)
    paid: Callable[..., object]
    #: the lease is refunded or failed before delivery: settle it as never delivered and
    #: return (cents taken back from the invoices, the invoices touched) for the lease's refund
    cancel: Callable[..., tuple[int, list[Invoice]]]
    #: the add-on's part of the lease's price still waiting for delivery
    pending_cents: Callable[[Lease], int]
    #: the add-on's part still inside the lease's price (not renewed with the lease once delivered)
    price_cents: Callable[[Lease], int]


_handlers: dict[str, AddonHandler] = {}


def addon_register(handler: AddonHandler) -> None:
    """Idempotent by name (ready() may run more than once in a test process)."""
    _handlers[handler.name] = handler


def order_paid(*, invoice: Invoice, now: datetime) -> None:
    for handler in _handlers.values():
        handler.paid(invoice=invoice, now=now)


def lease_cancel(*, lease: Lease, now: datetime) -> tuple[int, list[Invoice]]:
    cents, touched = 0, []
    for handler in _handlers.values():
        taken, invoices = handler.cancel(lease=lease, now=now)
        cents += taken
        touched += invoices
    return cents, touched


def pending_cents(lease: Lease) -> int:
    return sum(handler.pending_cents(lease) for handler in _handlers.values())


def price_cents(lease: Lease) -> int:
    return sum(handler.price_cents(lease) for handler in _handlers.values())

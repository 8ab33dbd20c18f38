"""How much stock unpaid orders may hold (an order count per account, then GPU counts per account and per address).

An unpaid order holds its GPUs until its payment window closes. An attack held all 8
MI300X with one 8-GPU order and re-ordered one tick after it expired, and three accounts
from one address took every 8× H100. So, besides MAX_OPEN_UNPAID_ORDERS per account:

- MAX_UNPAID_GPUS_PER_ACCOUNT and MAX_UNPAID_GPUS_PER_IP: GPUs held by unpaid orders, per
  account and per client address (the address the order came from, as django-axes
  resolves it behind the proxy, kept on the lease as `ordered_from`);
- UNPAID_EXPIRY_COOLDOWN_MINUTES: after an unpaid order expires, its account and its
  address hold nothing new for that long.

Those counts are a ceiling across every SKU; their defaults equal a whole 8-GPU node, so
three account/address pairs rotating still held all 8 MI300X. Each SKU (a GPU model, its
sellable units across the active sites) therefore also has a rule that scales with its
stock, `sku_hold_refusal`, the one rule for the web checkout and the API:

- an unpaid order never takes the last UNPAID_HOLD_RESERVE_UNITS free units: those are
  left to an order paid at once (from the balance);
- the unpaid holds of one account, one client address (IPv4 address, IPv6 /64) and one
  network (UNPAID_HOLD_NETWORK_PREFIX_V4, _V6: a /24, a /48) may come to at most
  UNPAID_HOLD_MAX_SHARE_BPS of the units free to them (free now + what they already hold
  of the SKU), rounded down but at least 1 where the reserve still stands after the order.

An order paid from the balance at once holds nothing unpaid and is never refused here.
Counted under locks (the account row; for the address a PostgreSQL advisory lock; for the
SKU its nodes' rows), so concurrent orders count one after the other."""
import ipaddress
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Sum
from django.utils import formats
from django.utils.translation import gettext as _

from inventory.models import Offer
from inventory.services import sku_free_units_locked
from rental.accounts.throttle import IPV6_CLIENT_PREFIX
from rental.models import Lease, LeaseState

from .ledger import TooManyOpenOrders
from .models import Invoice


class UnpaidHoldRefused(TooManyOpenOrders):
    """An unpaid order would take more of a SKU than its share, or its reserve. `may_hold`:
    how many GPUs of the SKU this order could still hold unpaid (0: none now)."""

    def __init__(self, message: str, *, code: str, may_hold: int):
        super().__init__(message)
        self.code, self.may_hold = code, may_hold


def lock_address(address: str) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"unpaid-hold:{address}"])


def unpaid_gpus(scope: dict) -> int:
    return (Lease.objects.filter(**scope, state=LeaseState.PENDING)
            .aggregate(n=Sum("offer__gpu_count"))["n"] or 0)


def last_expiry(scope: dict, now: datetime) -> datetime | None:
    """When an unpaid order of `scope` (a lease filter) last expired within the cool-down."""
    since = now - timedelta(minutes=settings.UNPAID_EXPIRY_COOLDOWN_MINUTES)
    return (Invoice.objects.filter(**{f"lease__{k}": v for k, v in scope.items()}, kind=Invoice.Kind.ORDER,
                                   state=Invoice.State.EXPIRED, expires_at__gt=since, expires_at__lte=now)
            .order_by("-expires_at").values_list("expires_at", flat=True).first())


def hold_refusal(*, customer: User, gpus: int, client_address: str | None, now: datetime) -> str | None:
    """Why an unpaid order of `gpus` GPUs is refused now, or None. The caller holds the
    account's row lock; the address's lock is taken here."""
    scopes = [({"customer": customer}, settings.MAX_UNPAID_GPUS_PER_ACCOUNT, _("your account"))]
    if client_address:
        lock_address(client_address)
        scopes.append(({"ordered_from": client_address}, settings.MAX_UNPAID_GPUS_PER_IP, _("your address")))
    for scope, limit, whose in scopes:
        expired = last_expiry(scope, now)
        if expired is not None:
            until = expired + timedelta(minutes=settings.UNPAID_EXPIRY_COOLDOWN_MINUTES)
            return (_("An unpaid order of %(whose)s expired at %(at)s UTC: new unpaid orders can hold GPUs again "
                      "from %(until)s UTC. You can order now and pay from your balance.")
                    % {"whose": whose, "at": formats.time_format(expired, "H:i"),
                       "until": formats.time_format(until, "H:i")})
        held = unpaid_gpus(scope)
        if held + gpus > limit:
            return (_("Unpaid orders of %(whose)s already hold %(held)d GPUs; at most %(limit)d GPUs can wait for "
                      "payment at once. Pay or cancel an order, or pay this one from your balance.")
                    % {"whose": whose, "held": held, "limit": limit})
    return None


# --- the share of a SKU's stock -----------------------------------------------------------

def _network(address: str | None, v4_prefix: int, v6_prefix: int):
    """The network of `prefix` bits around `address` (an IPv4 client seen through a
    dual-stack socket is its IPv4 address), or None for no valid address."""
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = min(max(v4_prefix if ip.version == 4 else v6_prefix, 0), ip.max_prefixlen)  # a bad setting: no 500
    return ipaddress.ip_network(f"{ip}/{prefix}", strict=False)


def hold_address(address: str | None):
    """One client address as the hold rule counts it: the IPv4 address, the IPv6 /64 (a host
    picks any address of its /64, so each would be a fresh client)."""
    return _network(address, 32, IPV6_CLIENT_PREFIX)


def hold_network(address: str | None):
    """One network as the hold rule counts it (a /24, a /48 by default)."""
    return _network(address, settings.UNPAID_HOLD_NETWORK_PREFIX_V4, settings.UNPAID_HOLD_NETWORK_PREFIX_V6)


def hold_share(units: int) -> int:
    """GPUs one account, address or network may hold unpaid of `units` free to it: the
    share, rounded down, at least 1 (the reserve is checked on its own)."""
    bps = min(max(settings.UNPAID_HOLD_MAX_SHARE_BPS, 0), 10_000)
    return max(units * bps // 10_000, 1)


def sku_hold_refusal(*, customer: User, offer: Offer, client_address: str | None) -> UnpaidHoldRefused | None:
    """Why an unpaid order of `offer` is refused by its SKU's share and reserve, or None.
    Takes the SKU's lock (its nodes' rows) until the transaction ends. When the SKU has no
    room for the order at all, None: the allocation answers "sold out"."""
    gpus, model = offer.gpu_count, offer.gpu_model
    free = sku_free_units_locked(gpu_model_id=offer.gpu_model_id)
    if free < gpus:
        return None
    reserve = max(settings.UNPAID_HOLD_RESERVE_UNITS, 0)
    pending = (Lease.objects.filter(state=LeaseState.PENDING, offer__gpu_model_id=offer.gpu_model_id)
               .values_list("customer_id", "ordered_from", "offer__gpu_count"))
    scopes = [(_("your account"), lambda cid, _addr: cid == customer.pk)]
    address, network = hold_address(client_address), hold_network(client_address)
    if address is not None:
        scopes.append((_("your address"), lambda _cid, addr: hold_address(addr) == address))
        scopes.append((_("your network"), lambda _cid, addr: hold_network(addr) == network))
    may = max(free - reserve, 0)  # GPUs an unpaid order could hold now, by every rule
    over = None  # the first scope whose share this order passes
    for whose, mine in scopes:
        held = sum(n for cid, addr, n in pending if mine(cid, addr))
        share = hold_share(free + held)
        may = max(min(may, share - held), 0)
        if over is None and held + gpus > share:
            over = {"whose": whose, "share": share, "units": free + held, "held": held}
    if free - gpus < reserve:
        return UnpaidHoldRefused(
            _("Only %(free)d %(model)s are free and the last %(reserve)d are kept for orders paid at once: pay now "
              "from your balance, or order fewer GPUs (an unpaid order may hold %(may)d now).")
            % {"free": free, "model": model.name, "reserve": reserve, "may": may},
            code="unpaid_hold_reserve", may_hold=may)
    if over is not None:
        return UnpaidHoldRefused(
            _("Unpaid orders of %(whose)s may hold at most %(share)d of the %(units)d %(model)s free to you, and "
              "already hold %(held)d: pay now from your balance, or order fewer GPUs (an unpaid order may hold "
              "%(may)d now).") % {**over, "model": model.name, "may": may},
            code="unpaid_hold_share", may_hold=may)
    return None

"""How much stock unpaid orders may hold (issue 16's order count, issue 28's GPU counts).

An unpaid order holds its GPUs until its payment window closes. An attack held all 8
MI300X with one 8-GPU order and re-ordered one tick after it expired, and three accounts
from one address took every 8× H100. So, besides MAX_OPEN_UNPAID_ORDERS per account:

- MAX_UNPAID_GPUS_PER_ACCOUNT and MAX_UNPAID_GPUS_PER_IP: GPUs held by unpaid orders, per
  account and per client address (the address the order came from, as django-axes
  resolves it behind the proxy, kept on the lease as `ordered_from`);
- UNPAID_EXPIRY_COOLDOWN_MINUTES: after an unpaid order expires, its account and its
  address hold nothing new for that long.

An order paid from the balance at once holds nothing unpaid and is never refused here.
Counted under locks (the account row; for the address a PostgreSQL advisory lock), so
concurrent orders count one after the other."""
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Sum
from django.utils import formats
from django.utils.translation import gettext as _

from rental.models import Lease, LeaseState

from .models import Invoice


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

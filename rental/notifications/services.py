"""Every write of the notifications ledger and the webhooks (see the package doc)."""
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _

from core.rows import insert_many_once
from inventory.audit import audit_record

from .models import Dispatch, WebhookDelivery, WebhookEndpoint, new_secret
from .sending import Refused, check_url, post

log = logging.getLogger(__name__)
D = WebhookDelivery.State

#: The events a webhook receives (the notice kinds map onto them in `notice_event`).
EVENTS = ("order.placed", "invoice.paid", "instance.ready", "invoice.renewal", "lease.reminder", "lease.suspended",
          "lease.released", "key.destroyed", "incident", "lease.migrated", "lease.failed", "webhook.test",
          "lease.workbench_changed", "lease.idle")
NOTICE_EVENTS = {"renewal_invoice": "invoice.renewal", "suspended": "lease.suspended", "released": "lease.released",
                 "connection_changed": "lease.migrated", "migration": "lease.migrated", "incident": "incident",
                 "provisioning_failed": "lease.failed", "gpus_idle": "lease.idle"}


def notice_event(kind: str) -> str:
    if kind.startswith("reminder_"):
        return "lease.reminder"
    if kind.startswith("migrat"):
        return "lease.migrated"
    return NOTICE_EVENTS.get(kind, f"notice.{kind}")


def lease_term(lease, at: datetime | None) -> str:
    """The ledger's term of a lease event: the lease and the moment the event is about."""
    return f"lease:{lease.pk}@{at.isoformat()}" if at else f"lease:{lease.pk}"


# --- the ledger -----------------------------------------------------------------------------

def dispatch_claim(*, recipient: str, event: str, term: str, now: datetime, customer=None,
                   lease=None) -> Dispatch | None:
    """The ledger row for this message, or None when it was claimed before (then it has
    been or is being sent and must not be sent again). One INSERT … ON CONFLICT DO NOTHING,
    so the caller's transaction carries on either way; under concurrency the unique
    constraint decides."""
    claimed = dispatch_claim_many([Dispatch(recipient=recipient, event=event, term=term[:120], created_at=now,
                                            customer=customer, lease=lease)])
    return claimed[0] if claimed else None


def dispatch_claim_many(dispatches: list[Dispatch]) -> list[Dispatch]:
    """`dispatch_claim` for many unsaved ledger rows at once (a statement per chunk, not per
    message): the ones claimed now, in order; a repeat of one claimed before (or earlier in the
    list) is left out. The unique constraint decides under concurrency, as for one."""
    for dispatch in dispatches:
        dispatch.term = dispatch.term[:120]
    seen, unique = set(), []
    for dispatch in dispatches:
        key = (dispatch.recipient, dispatch.event, dispatch.term)
        if key not in seen:
            seen.add(key)
            unique.append(dispatch)
    return insert_many_once(unique, key=("recipient", "event", "term"))


def dispatch_mark_sent(*, dispatch_id: int, now: datetime) -> None:
    Dispatch.objects.filter(pk=dispatch_id, sent_at__isnull=True).update(sent_at=now)


# --- events ---------------------------------------------------------------------------------

#: Events that reach the customer's own endpoint only: a customer's "send a test event" is no
#: news to the operators (and must not let a customer make the store call them at will).
CUSTOMER_ONLY = frozenset({"webhook.test"})


def _endpoints_for_many(customer_ids):
    scope = Q(scope=WebhookEndpoint.Scope.OPERATOR)
    if customer_ids:
        scope |= Q(scope=WebhookEndpoint.Scope.CUSTOMER, owner_id__in=sorted(customer_ids))
    return WebhookEndpoint.objects.filter(scope, is_active=True, owner__is_active=True).order_by("pk")


def event_emit(*, event: str, term: str, customer, data, now: datetime | None = None,
               lease=None) -> list[WebhookDelivery]:
    """The event goes to the customer's endpoint and every operator endpoint (a CUSTOMER_ONLY
    event to the customer's alone), once per (endpoint, event, term); deliveries start when the
    caller's transaction commits.
    `data` is the payload's data, or a callable making it (only called when some endpoint
    listens, so an event nobody receives costs one query)."""
    return events_emit([Event(event=event, term=term, customer=customer, data=data, lease=lease)], now=now)


@dataclass
class Event:
    """One webhook event for `events_emit` (the arguments of `event_emit`)."""
    event: str
    term: str
    customer: object
    data: object
    lease: object = None


def events_emit(events: list[Event], *, now: datetime | None = None) -> list[WebhookDelivery]:
    """`event_emit` for many events at once (a lifecycle batch): the endpoints of all their
    customers in one query — so a batch whose customers have none costs that one query — and
    the ledger claims of each endpoint's events in one statement."""
    now = now or timezone.now()
    if not events:
        return []
    customer_ids = {getattr(e.customer, "pk", e.customer) for e in events} - {None}
    endpoints = list(_endpoints_for_many(customer_ids))
    if not endpoints:
        return []
    made = []
    for endpoint in endpoints:
        mine = [e for e in events if (endpoint.scope == WebhookEndpoint.Scope.OPERATOR and e.event not in CUSTOMER_ONLY)
                or endpoint.owner_id == getattr(e.customer, "pk", e.customer)]
        claims = dispatch_claim_many([
            Dispatch(recipient=f"webhook:{endpoint.pk}", event=e.event, term=e.term, created_at=now,
                     customer=e.customer if getattr(e.customer, "pk", None) else None, lease=e.lease)
            for e in mine])
        claimed = {(d.event, d.term): d for d in claims}
        for e in mine:
            dispatch = claimed.pop((e.event, e.term[:120]), None)
            if dispatch is None:
                continue
            if callable(e.data):
                e.data = e.data()
            made.append(_delivery_create(dispatch=dispatch, endpoint=endpoint, event=e.event, now=now,
                                         data={**e.data, "customer": getattr(e.customer, "username", None)}))
    return made


def _delivery_create(*, dispatch: Dispatch, endpoint: WebhookEndpoint, event: str, now: datetime, data: dict,
                     redelivery_of: WebhookDelivery | None = None, actor=None) -> WebhookDelivery:
    delivery = WebhookDelivery(dispatch=dispatch, endpoint=endpoint, event=event, created_at=now,
                               next_attempt_at=now, redelivery_of=redelivery_of,
                               requested_by=actor if getattr(actor, "pk", None) else None)
    delivery.payload = {"id": str(delivery.delivery_id), "type": event, "created_at": now.isoformat(),
                        "term": dispatch.term, "data": data}
    delivery.save()
    transaction.on_commit(lambda: _queue(delivery.pk, now))
    return delivery


def _queue(delivery_id: int, at: datetime, countdown: float = 0) -> None:
    if countdown and settings.CELERY_TASK_ALWAYS_EAGER:
        return  # eager (tests, `make run` without a worker): the sweep retries when it is due
    try:
        webhook_deliver.apply_async((delivery_id, at.isoformat()), countdown=countdown)
    except Exception:  # a broker outage must not undo the event: the sweep delivers it
        log.exception("could not queue webhook delivery %s", delivery_id)


# --- deliveries -----------------------------------------------------------------------------

def retry_delay(attempts: int) -> timedelta | None:
    """After the n-th failed attempt, the wait before the next (None: no more)."""
    schedule = settings.WEBHOOK_RETRY_SECONDS
    return timedelta(seconds=schedule[attempts - 1]) if attempts <= len(schedule) else None


#: What `delivery_attempt` returns when the account already has its share of attempts in flight.
BUSY = "busy"


def _lease() -> timedelta:
    return timedelta(seconds=settings.WEBHOOK_ATTEMPT_LEASE_SECONDS)


def _claim(delivery_id: int, now: datetime) -> tuple[int, datetime] | str | None:
    """Takes the delivery for one attempt: (its endpoint's owner, the claim's time, which the
    attempt's result must match), BUSY when the owner has WEBHOOK_CONCURRENCY_PER_ACCOUNT
    attempts in flight already, or None when it is not due or someone else holds it. The
    owner's endpoints are locked first, so concurrent claims for one account count each other."""
    with transaction.atomic():
        owner = (WebhookDelivery.objects.filter(pk=delivery_id, state=D.PENDING, next_attempt_at__lte=now)
                 .values_list("endpoint__owner_id", flat=True).first())
        if owner is None:
            return None
        list(WebhookEndpoint.objects.select_for_update().filter(owner_id=owner).order_by("pk").values_list("pk"))
        in_flight = WebhookDelivery.objects.filter(endpoint__owner_id=owner, state=D.SENDING,
                                                   claimed_at__gt=now - _lease()).count()
        if in_flight >= settings.WEBHOOK_CONCURRENCY_PER_ACCOUNT:
            return BUSY
        claimed = WebhookDelivery.objects.filter(pk=delivery_id, state=D.PENDING, next_attempt_at__lte=now).update(
            state=D.SENDING, claimed_at=now)
        return (owner, now) if claimed else None


def delivery_attempt(*, delivery_id: int, now: datetime) -> str | None:
    """One attempt, if the delivery is due, nobody else holds it and its account has a free
    slot: claimed with a guarded update (pending → sending, a lease of
    WEBHOOK_ATTEMPT_LEASE_SECONDS), posted outside any transaction (at most
    WEBHOOK_ATTEMPT_DEADLINE_SECONDS), then recorded only if the claim is still this attempt's.
    Returns the new state, BUSY (left pending: the account's next finished attempt queues it,
    else the sweep), or None when there was nothing to do (delivered, not due, claimed) or the
    attempt's lease was lost before it ended (its result is dropped; the delivery is retried)."""
    claim = _claim(delivery_id, now)
    if not isinstance(claim, tuple):
        return claim
    owner, claimed_at = claim
    delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    outcome = post(url=delivery.endpoint.url, secret=delivery.endpoint.secret, msg_id=str(delivery.delivery_id),
                   event=delivery.event, timestamp=int(now.timestamp()), body=body)
    attempts = delivery.attempts + 1
    fields = {"attempts": attempts, "last_status": outcome.status, "last_error": outcome.error[:300],
              "claimed_at": None}
    if outcome.ok:
        state = D.DELIVERED
        fields.update(delivered_at=now, next_attempt_at=None)
    elif (delay := retry_delay(attempts)) is not None and delivery.endpoint.is_active:
        state = D.PENDING
        fields["next_attempt_at"] = now + delay
    else:
        state = D.FAILED
        fields["next_attempt_at"] = None
    recorded = WebhookDelivery.objects.filter(pk=delivery_id, state=D.SENDING, claimed_at=claimed_at).update(
        state=state, **fields)
    if recorded and outcome.ok:
        dispatch_mark_sent(dispatch_id=delivery.dispatch_id, now=now)
    if recorded and state == D.PENDING:
        _queue(delivery_id, fields["next_attempt_at"], countdown=(fields["next_attempt_at"] - now).total_seconds())
    _queue_next_of(owner, now)
    return state if recorded else None


def _queue_next_of(owner: int, now: datetime) -> None:
    """A finished attempt hands its slot on: the account's oldest due delivery (one left
    pending as BUSY) is queued now rather than at the next sweep. Not with eager Celery, where
    queueing is attempting, one inside the other (the sweep attempts them there)."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return
    waiting = (WebhookDelivery.objects.filter(endpoint__owner_id=owner, state=D.PENDING, next_attempt_at__lte=now)
               .order_by("next_attempt_at", "pk").values_list("pk", flat=True).first())
    if waiting is not None:
        _queue(waiting, now)


@shared_task(name="rental.webhook_deliver", acks_late=True,
             # The backstop of the attempt's own deadline (a prefork worker kills the task),
             # before its lease expires and the sweep could let a second attempt start.
             time_limit=(settings.WEBHOOK_ATTEMPT_DEADLINE_SECONDS + settings.WEBHOOK_ATTEMPT_LEASE_SECONDS) / 2)
def webhook_deliver(delivery_id: int, at: str | None = None) -> str | None:
    """One attempt of one webhook delivery, on the outbound worker (CELERY_TASK_ROUTES). `at`:
    the moment the attempt is due (the sweep's clock); never before it is due. Defined beside
    the attempt it runs, so that queueing it imports nothing back (rental/notifications/tasks.py
    lists it for CELERY_IMPORTS)."""
    now = max(timezone.now(), datetime.fromisoformat(at)) if at else timezone.now()
    return delivery_attempt(delivery_id=delivery_id, now=now)


def sweep_webhooks(now: datetime, limit: int = 200) -> list:
    """Due deliveries are queued (a lost queue message, a retry whose countdown a worker
    restart dropped, one left pending while its account was busy; eager Celery attempts them
    at once); one whose attempt's lease expired (its worker died) is freed first. An attempt
    in flight still holds its lease, which outlasts its deadline: the sweep never starts a
    second one beside it. Queuing twice is harmless: an attempt claims the row."""
    from rental.events import Transition

    WebhookDelivery.objects.filter(state=D.SENDING, claimed_at__lte=now - _lease()).update(
        state=D.PENDING, claimed_at=None)
    due = (WebhookDelivery.objects.filter(state=D.PENDING, next_attempt_at__lte=now).order_by("next_attempt_at", "pk")
           .values_list("pk", "dispatch__lease_id")[:limit])
    done = []
    for pk, lease_id in due:
        _queue(pk, now)
        done.append(Transition(lease_id or 0, f"webhook delivery {pk} attempted"))
    return done


@transaction.atomic
def delivery_redeliver(*, delivery: WebhookDelivery, actor, now: datetime | None = None) -> WebhookDelivery:
    """"Redeliver" (settings page, admin): a new delivery of the same event and payload data
    with a new delivery id — the one way the same event reaches an endpoint twice."""
    now = now or timezone.now()
    original = WebhookDelivery.objects.select_related("dispatch", "endpoint").get(pk=delivery.pk)
    again = _delivery_create(dispatch=original.dispatch, endpoint=original.endpoint, event=original.event, now=now,
                             data=original.payload.get("data", {}), redelivery_of=original, actor=actor)
    audit_record(actor=actor, action="webhook_redeliver", obj=again,
                 detail={"of": str(original.delivery_id), "event": original.event})
    return again


# --- endpoints ------------------------------------------------------------------------------

def webhook_url_validate(url: str) -> str:
    url = url.strip()
    check_url(url)  # raises Refused
    if len(url) > 500:
        raise Refused(_("the URL is longer than 500 characters"))
    return url


@transaction.atomic
def webhook_endpoint_save(*, customer, url: str, now: datetime | None = None) -> tuple[WebhookEndpoint, str | None]:
    """The customer's endpoint (one per account): created with a new secret (returned, to
    show once) or its URL changed (secret kept: None). Raises Refused for a bad URL."""
    url = webhook_url_validate(url)
    now = now or timezone.now()
    endpoint = WebhookEndpoint.objects.select_for_update().filter(
        owner=customer, scope=WebhookEndpoint.Scope.CUSTOMER).first()
    if endpoint is None:
        endpoint = WebhookEndpoint.objects.create(owner=customer, url=url, created_at=now)
        audit_record(actor=customer, action="webhook_endpoint_create", obj=endpoint, detail={"url": url})
        return endpoint, endpoint.secret
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=url, is_active=True)
    audit_record(actor=customer, action="webhook_endpoint_update", obj=endpoint, detail={"url": url})
    endpoint.refresh_from_db()
    return endpoint, None


@transaction.atomic
def webhook_secret_rotate(*, endpoint: WebhookEndpoint, actor) -> str:
    secret = new_secret()
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret=secret)
    audit_record(actor=actor, action="webhook_secret_rotate", obj=endpoint)
    return secret


@transaction.atomic
def webhook_endpoint_delete(*, customer) -> bool:
    endpoint = WebhookEndpoint.objects.filter(owner=customer, scope=WebhookEndpoint.Scope.CUSTOMER).first()
    if endpoint is None:
        return False
    audit_record(actor=customer, action="webhook_endpoint_delete", obj=endpoint, detail={"url": endpoint.url})
    endpoint.delete()
    return True


__all__ = ["EVENTS", "Refused", "dispatch_claim", "event_emit", "delivery_attempt", "delivery_redeliver",
           "sweep_webhooks", "webhook_endpoint_save", "webhook_secret_rotate", "webhook_endpoint_delete"]


def lease_data(lease) -> dict:
    """What every lease event's payload says about the lease (no secrets), as it is now."""
    from rental.api_schema import iso
    from rental.models import Lease

    lease = Lease.objects.select_related("offer", "site").get(pk=lease.pk)
    return {"id": lease.pk, "state": lease.state, "offer": lease.offer.slug, "site": lease.site.code,
            "term": lease.term, "price_cents": lease.price_cents, "ends_at": iso(lease.ends_at),
            "hold_until": iso(lease.hold_until), "wipe_by": iso(lease.wipe_by),
            "ssh": lease.ssh_command or None,
            # the key that signs this server's records, given before any record exists
            "node_key_fingerprint": (lease.node_key_fingerprints() or [None])[-1]}


def lease_event_emit(*, event: str, lease, at: datetime | None, now: datetime, **extra) -> list[WebhookDelivery]:
    """A lease's event to its customer's and the operators' endpoints, once per term."""
    return event_emit(event=event, term=lease_term(lease, at), customer=lease.customer, lease=lease, now=now,
                      data=lambda: {"lease": lease_data(lease), **extra})

"""A notice to a lease's customer (`notify`): claimed once per lease, kind and deadline in the
notifications ledger together with the in-app notice, e-mailed when the customer gave an
address, and sent as the matching webhook event; written in the customer's language
(`customer_language`). Used by the lease services, the notice sweep, storage and failover,
all of which sit above this package (issue 33: storage and failover imported rental.services
for it, in a circle)."""
from datetime import datetime

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone, translation

from inventory.rows import insert_once

from ..accounts.services import _loaded_settings
from ..models import CustomerSettings, Lease, Notification
from .services import dispatch_claim, event_emit, lease_data, lease_term, notice_event


def customer_language(user) -> "translation.override":
    """Notices are written in the language the customer last chose on the site (stored by
    the language switcher), else the site default; use as ``with customer_language(user):``."""
    loaded = _loaded_settings(user)
    lang = loaded.language if loaded else CustomerSettings.objects.filter(user_id=getattr(user, "pk", None)).values_list(
        "language", flat=True).first()
    return translation.override(lang or settings.LANGUAGE_CODE)


def notify(*, lease: Lease, kind: str, deadline: datetime, subject: str, body: str,
           now: datetime | None = None) -> bool:
    """Once per (lease, kind, deadline): claimed in the notifications ledger (issue 30) with
    the in-app notice in one transaction, e-mailed when the customer gave an address, and
    sent as the matching webhook event. `now` is the sweep's clock (a simulated one under
    `manage.py lifecycle --at`)."""
    now = now or timezone.now()
    term = f"{lease_term(lease, deadline)}/{kind}"  # a 3-day and a 1-day reminder are two messages
    if dispatch_claim(recipient=f"user:{lease.customer_id}", event=kind, term=term, now=now,
                      customer=lease.customer, lease=lease) is None:
        return False
    note = Notification(lease=lease, customer_id=lease.customer_id, kind=kind, deadline=deadline,
                        subject=subject, body=body, created_at=now)
    if not insert_once(note):
        return False
    note_id = note.pk
    event_emit(event=notice_event(kind), term=term, customer=lease.customer, lease=lease, now=now,
               data=lambda: {"lease": lease_data(lease), "notice": {"kind": kind, "subject": subject, "body": body,
                                                                      "deadline": deadline.isoformat()}})
    email = lease.customer.email
    if email:
        def send():
            send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [email], fail_silently=True)
            Notification.objects.filter(pk=note_id).update(emailed_at=now)
        transaction.on_commit(send)
    return True

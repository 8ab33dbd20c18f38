"""A notice to a lease's customer (`notify`): claimed once per lease, kind and deadline in the
notifications ledger together with the in-app notice, e-mailed when the customer gave an
address, and sent as the matching webhook event; written in the customer's language
(`customer_language`). Used by the lease services, the notice sweep, storage and failover,
all of which sit above this package (storage and failover imported rental.services
for it, in a circle)."""
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone, translation

from core.rows import insert_many_once

from ..accounts.services import _loaded_settings
from ..models import CustomerSettings, Lease, Notification
from .models import Dispatch
from .services import Event, dispatch_claim_many, events_emit, lease_data, lease_term, notice_event


def customer_language(user) -> "translation.override":
    """Notices are written in the language the customer last chose on the site (stored by
    the language switcher), else the site default; use as ``with customer_language(user):``."""
    loaded = _loaded_settings(user)
    lang = loaded.language if loaded else CustomerSettings.objects.filter(user_id=getattr(user, "pk", None)).values_list(
        "language", flat=True).first()
    return translation.override(lang or settings.LANGUAGE_CODE)


def notify(*, lease: Lease, kind: str, deadline: datetime, subject: str, body: str,
           now: datetime | None = None) -> bool:
    """Once per (lease, kind, deadline): claimed in the notifications ledger with
    the in-app notice in one transaction, e-mailed when the customer gave an address, and
    sent as the matching webhook event. `now` is the sweep's clock (a simulated one under
    `manage.py lifecycle --at`). One notice of `notify_many`."""
    return bool(notify_many([Notice(lease=lease, kind=kind, deadline=deadline, subject=subject, body=body)],
                            now=now))


@dataclass
class Notice:
    """One notice to a lease's customer (the arguments of `notify`)."""
    lease: Lease
    kind: str
    deadline: datetime
    subject: str
    body: str

    @property
    def term(self) -> str:
        return f"{lease_term(self.lease, self.deadline)}/{self.kind}"  # a 3-day and a 1-day reminder are two


def notify_many(notices: list[Notice], *, now: datetime | None = None) -> list[Notice]:
    """`notify` for a lifecycle batch: the ledger claims, the in-app notices and the webhook
    events of all of them in a few statements, not a few per notice; the e-mails go out in
    one on-commit hook. Returns the notices sent now (each once per lease, kind and deadline:
    one claimed before, or twice in the list, is left out)."""
    now = now or timezone.now()
    claims = dispatch_claim_many([Dispatch(recipient=f"user:{n.lease.customer_id}", event=n.kind, term=n.term,
                                           created_at=now, customer=n.lease.customer, lease=n.lease)
                                  for n in notices])
    claimed = {(c.lease_id, c.event, c.term) for c in claims}
    notes = {}
    for n in notices:
        if (n.lease.pk, n.kind, n.term[:120]) in claimed:
            claimed.discard((n.lease.pk, n.kind, n.term[:120]))
            notes[id(n)] = Notification(lease=n.lease, customer_id=n.lease.customer_id, kind=n.kind,
                                        deadline=n.deadline, subject=n.subject, body=n.body, created_at=now)
    inserted = {id(note) for note in _insert_notes(list(notes.values()))}
    sent = [n for n in notices if id(notes.get(id(n))) in inserted]
    events_emit([Event(event=notice_event(n.kind), term=n.term, customer=n.lease.customer, lease=n.lease,
                       data=_notice_data(n)) for n in sent], now=now)
    mail = [(notes[id(n)].pk, n.subject, n.body + mail_footer(n.lease), n.lease.customer.email)
            for n in sent if n.lease.customer.email]
    if mail:
        transaction.on_commit(lambda: _send_mail(mail, now))
    return sent


def _insert_notes(notes: list[Notification]) -> list[Notification]:
    """The notices inserted, in rounds of distinct (lease, kind) (what tells them apart on the
    way back); a duplicate of one already held is not inserted."""
    inserted, left = [], notes
    while left:
        seen, this_round, later = set(), [], []
        for note in left:
            (later if (note.lease_id, note.kind) in seen else this_round).append(note)
            seen.add((note.lease_id, note.kind))
        inserted += insert_many_once(this_round, key=("lease_id", "kind"))
        left = later
    return inserted


def _notice_data(n: Notice):
    return lambda: {"lease": lease_data(n.lease), "notice": {"kind": n.kind, "subject": n.subject, "body": n.body,
                                                             "deadline": n.deadline.isoformat()}}


def public_url(path: str) -> str:
    """An absolute link for an e-mail: PUBLIC_URL, else https:// and the first named host of
    ALLOWED_HOSTS."""
    base = settings.PUBLIC_URL or next((f"https://{host}" for host in settings.ALLOWED_HOSTS
                                        if host not in ("*", "") and not host.startswith(".")), "")
    return base.rstrip("/") + path


def mail_footer(lease: Lease) -> str:
    """What every notice e-mail ends with: the store's name and the lease's page."""
    from django.urls import reverse

    return f"\n\n-- \n{settings.OPERATOR_NAME}\n{public_url(reverse('lease_detail', args=[lease.pk]))}\n"


def _send_mail(mail: list[tuple[int, str, str, str]], now: datetime) -> None:
    sent = []
    for note_id, subject, body, email in mail:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [email], fail_silently=True)
        sent.append(note_id)
    Notification.objects.filter(pk__in=sent).update(emailed_at=now)

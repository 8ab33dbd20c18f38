"""Every notice goes out once — in-app always, by e-mail when an address is given — even
when the sweeps run again, and whether the lease was suspended by the sweep or by hand."""
from datetime import timedelta

from django.core import mail
from django.utils import timezone

from billing.models import Invoice
from ops.lifecycle import run_lifecycle
from rental.models import Notification
from rental.services import lease_suspend


def test_each_notice_once_by_mail_and_in_app(catalog, customer, place, django_capture_on_commit_callbacks):
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=30)
    lease = place(customer, t0, term="week")
    end = lease.ends_at
    for at in (end - timedelta(days=3) + timedelta(minutes=1), end - timedelta(hours=23), end + timedelta(minutes=1),
               end + timedelta(hours=72, minutes=1)):
        for _ in range(3):  # a sweep repeated, a duplicated beat
            with django_capture_on_commit_callbacks(execute=True):
                run_lifecycle(at)
    kinds = list(Notification.objects.filter(lease=lease).order_by("created_at", "id").values_list("kind", flat=True))
    assert sorted(kinds) == sorted(["reminder_3d", "reminder_1d", "renewal_invoice", "suspended", "released"])
    subjects = [m.subject for m in mail.outbox]
    assert len(subjects) == 5 and all(m.to == ["alice@example.org"] for m in mail.outbox)
    assert any("is suspended: pay by" in s for s in subjects) and any("was released" in s for s in subjects)
    suspended = Notification.objects.get(lease=lease, kind="suspended")
    # The hold counts from the stop (the pass at end + 1 min).
    assert suspended.deadline == end + timedelta(hours=72, minutes=1) and suspended.emailed_at is not None


def test_the_renewal_mail_links_to_paying_it(catalog, customer, place, settings, django_capture_on_commit_callbacks):
    """The store, the amount, the invoice's pay page (where the coin is chosen and its amount
    fixed for the payment window) and the lease."""
    settings.OPERATOR_NAME, settings.PUBLIC_URL = "Example GPUs", "https://gpus.example"
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=30)
    lease = place(customer, t0, term="week")
    with django_capture_on_commit_callbacks(execute=True):
        run_lifecycle(lease.ends_at - timedelta(hours=23))
    renewal = Invoice.objects.get(lease=lease, kind=Invoice.Kind.RENEWAL)
    [sent] = [m for m in mail.outbox if m.subject.startswith("Renewal invoice")]
    assert f"https://gpus.example/pay/invoice/{renewal.pk}/" in sent.body and "$65," in sent.body
    assert f"fixed for {settings.PAYMENT_WINDOW_MINUTES} minutes" in sent.body
    assert "Example GPUs" in sent.body and f"https://gpus.example/leases/{lease.pk}/" in sent.body


def test_in_app_only_without_an_address_and_manual_suspend(catalog, other_customer, place,
                                                           django_capture_on_commit_callbacks):
    now = timezone.now()
    lease = place(other_customer, now - timedelta(days=1), term="week")
    with django_capture_on_commit_callbacks(execute=True):
        assert lease_suspend(lease_id=lease.pk, now=now, force=True, reason="abuse report")
        run_lifecycle(now + timedelta(minutes=1))
        run_lifecycle(now + timedelta(minutes=2))
    note = Notification.objects.get(lease=lease, kind="suspended")
    assert note.emailed_at is None and mail.outbox == []

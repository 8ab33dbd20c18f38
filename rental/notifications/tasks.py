"""Thin Celery wrapper: one attempt of one webhook delivery (listed in CELERY_IMPORTS)."""
from datetime import datetime

from celery import shared_task
from django.utils import timezone


@shared_task(name="rental.webhook_deliver", acks_late=True)
def webhook_deliver(delivery_id: int, at: str | None = None) -> str | None:
    """`at`: the moment the attempt is due (the sweep's clock); never before it is due."""
    from .services import delivery_attempt

    now = max(timezone.now(), datetime.fromisoformat(at)) if at else timezone.now()
    return delivery_attempt(delivery_id=delivery_id, now=now)

"""The webhook delivery task, for CELERY_IMPORTS: defined in services.py beside the attempt it
runs (one attempt of one delivery, `rental.webhook_deliver`), so services and tasks import
each other in no circle."""
from .services import webhook_deliver

__all__ = ["webhook_deliver"]

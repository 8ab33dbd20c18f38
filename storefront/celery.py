"""Celery app. Broker: Redis when REDIS_URL is set, else a filesystem broker that needs
no server (the embedded default), so `make run` works on a bare machine."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "storefront.settings")

app = Celery("storefront")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

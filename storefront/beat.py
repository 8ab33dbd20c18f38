"""Celery beat with a heartbeat: every scheduler tick touches BEAT_HEARTBEAT_FILE, so the
beat container's healthcheck (`manage.py healthcheck beat`) can tell a live beat from a
hung or dead one by the file's age."""
from pathlib import Path

from celery.beat import PersistentScheduler
from django.conf import settings


class HeartbeatScheduler(PersistentScheduler):
    def tick(self, *args, **kwargs):
        Path(settings.BEAT_HEARTBEAT_FILE).touch()
        return super().tick(*args, **kwargs)

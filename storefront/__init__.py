"""The composition root: the Django project (settings/, test_settings.py, wsgi.py), the Celery
app (celery.py, loaded here so that every task binds to it) and the root URLconf (urls.py).
The only package that may import every other one (pyproject.toml, [tool.importlinter])."""
from .celery import app as celery_app

__all__ = ("celery_app",)

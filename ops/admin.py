"""The back office's admin screens (ops/backoffice/admin.py), found by the admin's
autodiscovery like any app's admin.py: after billing's admin, before fleet's, which builds
its node admin on the back office's."""
from .backoffice import admin as backoffice_admin  # noqa: F401  (registers the screens)

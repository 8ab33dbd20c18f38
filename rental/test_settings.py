"""Settings for the test suite: the same as production's shape, with fast hashing,
eager Celery (unless a test starts a real worker) and no SSL redirect."""
import os

os.environ.setdefault("TESTING", "1")

from .settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed only; prod uses Argon2

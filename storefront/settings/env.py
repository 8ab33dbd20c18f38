"""Reading the environment: the helpers every settings module uses, and the two switches
the others depend on (DEBUG, TESTING: test_settings.py sets TESTING before importing)."""
import os


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(int(default))).strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DEBUG")
TESTING = env_bool("TESTING")

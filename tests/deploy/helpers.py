"""Running the production settings in tests: the environment only tests may set, a free port,
the command line of a service."""
import socket
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


TEST_ONLY_ENV = {"TESTING", "DEBUG", "DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE",
                 "CELERY_TASK_ALWAYS_EAGER"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_command(service: str) -> list[str]:
    return COMPOSE["services"][service]["command"]

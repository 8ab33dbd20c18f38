"""Imports flow sizing <- inventory <- rental <- billing <- fleet: rental reaches the node
agent only through settings.HOST_AGENT (import_string), so no module below fleet imports it."""
import ast
from pathlib import Path

from django.conf import settings

BASE = Path(settings.BASE_DIR)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_nothing_below_fleet_imports_it():
    offenders = [str(path.relative_to(BASE)) for app in ("core", "sizing", "inventory", "rental", "billing", "storage", "ops")
                 for path in (BASE / app).rglob("*.py")
                 if any(name == "fleet" or name.startswith("fleet.") for name in imported_modules(path))]
    assert offenders == []

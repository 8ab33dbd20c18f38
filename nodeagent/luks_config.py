"""`disk_backend = "luks"`: the LUKS disk backend (nodeagent.disks) built by its own
factory from the config file's `[disks]` table (documented in nodeagent/disks/config.py
and docs/DISKS.md); a bad table is the agent's ConfigError, reported at start."""
from pathlib import Path

from .config import ConfigError


def open_luks_disks(options: dict, state_dir: Path):
    from .disks.config import disks_from_config

    try:
        return disks_from_config({"carver": "lvm", **options}, state_dir=Path(state_dir))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc

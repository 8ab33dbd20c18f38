"""`disk_backend = "luks"`: the LUKS disk backend (nodeagent.disks) built by its own
factory from the config file's `[disks]` table (documented in nodeagent/disks/config.py
and docs/DISKS.md); a bad table is the agent's ConfigError, reported at start."""
from pathlib import Path

from .config import ConfigError


def open_luks_disks(options: dict, state_dir: Path):
    from .disks.config import disks_from_config
    from .disks.mounts import shares_host_namespace

    if not shares_host_namespace():
        raise ConfigError(
            "the agent runs in its own mount namespace (systemd PrivateTmp=, ProtectHome=, "
            "ProtectSystem=, ReadWritePaths=…, or unshare): the LUKS volumes it mounts would be "
            "invisible to dockerd, which would bind the unencrypted directory underneath; "
            "run it with the shipped unit (nodeagent/systemd/gpu-node-agent.service)")
    try:
        return disks_from_config({"carver": "lvm", **options}, state_dir=Path(state_dir))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc

"""Where the server address and token live: <user config dir>/gpu-rent/config.json, the
file mode 0600 and its directory 0700. GPU_RENT_URL / GPU_RENT_TOKEN override it."""
import json
import os
import sys
from pathlib import Path


def config_dir() -> Path:
    if explicit := os.environ.get("GPU_RENT_CONFIG_DIR"):
        return Path(explicit)
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA", Path.home())) / "gpu-rent"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "gpu-rent"
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "gpu-rent"


def config_path() -> Path:
    return config_dir() / "config.json"


def load() -> dict:
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    if os.environ.get("GPU_RENT_URL"):
        data["url"] = os.environ["GPU_RENT_URL"]
    if os.environ.get("GPU_RENT_TOKEN"):
        data["token"] = os.environ["GPU_RENT_TOKEN"]
    return data


def save(data: dict) -> Path:
    """Writes atomically; the file is created 0600 (never readable by others, not even
    for a moment) and the directory 0700."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    path, tmp = config_path(), config_dir() / ".config.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def forget() -> bool:
    try:
        config_path().unlink()
    except FileNotFoundError:
        return False
    return True

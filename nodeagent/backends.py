"""Pick the disk backend and runtime named in the config. A disk backend is a factory
`open(options: dict, state_dir: Path) -> nodeagent.interfaces.Disks`, named here or given
as "package.module:factory" so another layout can be plugged in without editing this."""
import importlib

from .config import AgentConfig, ConfigError

DISK_BACKENDS = {
    "directory": "nodeagent.directory_disks:open_directory_disks",
    "luks": "nodeagent.luks_config:open_luks_disks",
}


def open_disks(config: AgentConfig):
    target = DISK_BACKENDS.get(config.disk_backend, config.disk_backend)
    module_name, _, factory_name = target.partition(":")
    if not factory_name:
        raise ConfigError(f"unknown disk_backend {config.disk_backend!r}: use "
                          f"{' or '.join(DISK_BACKENDS)} or 'package.module:factory'")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
        return factory(dict(config.disks), config.state_dir)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"disk_backend {config.disk_backend!r} cannot be loaded: {exc}") from exc


def open_runtime(config: AgentConfig):
    from .runtime.docker import DockerRuntime
    return DockerRuntime(config.docker, config.state_dir / "runtime",
                         images=frozenset(config.images.values()))

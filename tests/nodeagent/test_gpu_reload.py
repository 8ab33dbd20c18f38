"""The start check that a `systemctl daemon-reload` would not cut running instances off their
GPUs (nodeagent/preflight.py, gpu_reload; docs/adr/0013-burn-in-by-card-class.md): safe with
CDI or plain device entries, with the cgroupfs driver, or with a /dev/char link for every
NVIDIA device node (install-node.sh's udev rule); refused otherwise with the three fixes.
Device numbers here are the NVIDIA driver's (195 for the cards and nvidiactl, a dynamic
major for nvidia-uvm)."""
import os

import pytest

from nodeagent import preflight
from nodeagent.config import AgentConfig, DockerConfig

DEVICES = {"nvidia0": os.makedev(195, 0), "nvidia1": os.makedev(195, 1), "nvidiactl": os.makedev(195, 255),
           "nvidia-uvm": os.makedev(508, 0)}
SYSTEMD = {"CgroupDriver": "systemd"}


def links(tmp_path, names):
    char = tmp_path / "char"
    char.mkdir(exist_ok=True)
    for name in names:
        rdev = DEVICES[name]
        (tmp_path / name).touch()                   # the link's target (a device node on a node)
        (char / f"{os.major(rdev)}:{os.minor(rdev)}").symlink_to(f"../{name}")
    return char


def test_the_toolkit_mode_with_the_systemd_driver_needs_a_link_for_every_device(tmp_path):
    problem = preflight.gpu_reload(SYSTEMD, "nvidia", DEVICES, links(tmp_path, ["nvidia0", "nvidiactl"]))
    assert problem.check == "gpu_reload"
    assert "nvidia-uvm, nvidia1 have no /dev/char link" in problem.detail
    assert 'gpu_mode = "cdi"' in problem.fix and preflight.UDEV_RULE in problem.fix and "cgroupfs" in problem.fix
    assert preflight.gpu_reload(SYSTEMD, "nvidia", DEVICES, links(tmp_path, ["nvidia1", "nvidia-uvm"])) is None


@pytest.mark.parametrize("info, mode", [(SYSTEMD, "cdi"), (SYSTEMD, "devices"), ({"CgroupDriver": "cgroupfs"}, "nvidia")])
def test_cdi_plain_devices_or_cgroupfs_survive_a_reload_without_links(tmp_path, info, mode):
    assert preflight.gpu_reload(info, mode, DEVICES, tmp_path / "no-char-dir") is None


def test_the_device_nodes_are_read_from_dev_and_the_check_runs_at_start(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidia0", 0o600 | 0o020000, os.makedev(195, 0))     # S_IFCHR, as root does
    (dev / "nvidia-caps").mkdir()                                          # a directory: not a device
    assert preflight.nvidia_devices(dev) == {"nvidia0": os.makedev(195, 0)}
    assert "gpu_reload" in preflight.CHECKS
    config = AgentConfig(path=tmp_path / "c.toml", docker=DockerConfig(gpu_mode="cdi"))
    problems = preflight.node_problems(config, {"Driver": "overlay2", "CgroupDriver": "systemd",
                                                "ServerVersion": "28.3.0", "CDISpecDirs": []}, gpu_count=0)
    assert "gpu_reload" not in {p.check for p in problems}

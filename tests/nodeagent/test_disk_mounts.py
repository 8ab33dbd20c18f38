"""A lease's disk is mounted where dockerd sees it, and no container ever starts
while its disk is not mounted. Real parts: loop devices with ext4 (this host kernel has no
device-mapper, so the LUKS layer itself runs in the QEMU guest tests), mounts in the host
namespace and under `unshare --mount --propagation slave`, the private dockerd, and the
real agent process. The private dockerd has a mount namespace of its own (for its stand-in
/dev), a slave of the host's, and the tests' files are below a shared mount
(tests/nodeagent/conftest.py): a mount made in the host's namespace reaches dockerd as it
does on a node, where dockerd shares the host's namespace."""
import configparser
import os
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from nodeagent.config import DockerConfig
from nodeagent.converge import Converger
from nodeagent.disks.mounts import mounted_from, shares_host_namespace
from nodeagent.journal import Journal
from nodeagent.outbox import Outbox
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.signing import NodeKey
from tests.tools import require, require_tool

from .agent_process import IMAGE_SLUG, STUB_GPUS, agent_cli, agent_env, write_config
from .conftest import stand_in_devices
from .helpers import GPUS, RecordingRuntime, desired
from .storefront_double import StorefrontDouble

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "nodeagent" / "systemd" / "gpu-node-agent.service"
# systemd.exec(5): each of these gives the service its own mount namespace.
MOUNT_NAMESPACE_OPTIONS = {
    "PrivateTmp", "PrivateDevices", "PrivateMounts", "ProtectHome", "ProtectSystem",
    "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
    "ProtectControlGroups", "ProtectProc", "ProcSubset", "ReadWritePaths", "ReadOnlyPaths",
    "InaccessiblePaths", "ExecPaths", "NoExecPaths", "TemporaryFileSystem", "BindPaths",
    "BindReadOnlyPaths", "RootDirectory", "RootImage", "MountFlags", "DynamicUser",
    "PrivateUsers", "NetworkNamespacePath", "PrivateNetwork", "ProtectHostname", "MountAPIVFS"}


def _need_root_tools():
    require(os.geteuid() == 0, "mounts and loop devices need root")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount", "unshare"):
        require_tool(tool)


class LoopDisk:
    """A lease disk as the LUKS backend makes it, minus dm-crypt: a block device with
    ext4, mounted at a mount point by `ensure_ready`, checked in the host's view."""

    def __init__(self, tmp_path: Path):
        backing = tmp_path / "lease.img"
        with open(backing, "wb") as f:
            f.truncate(32 * 1024 * 1024)
        self.device = subprocess.run(["losetup", "--find", "--show", str(backing)],
                                     capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run(["mkfs.ext4", "-q", self.device], check=True)
        self.mountpoint = tmp_path / "mnt" / "lease"
        self.mountpoint.mkdir(parents=True)
        self.ready_calls = 0
        self.mount_on_ready = True

    def ensure_ready(self, lease_id: int, size_gb: int) -> str:
        self.ready_calls += 1
        if self.mount_on_ready and not self.is_ready(lease_id):
            subprocess.run(["mount", self.device, str(self.mountpoint)], check=True)
        return str(self.mountpoint)

    def is_ready(self, lease_id: int) -> bool:
        return mounted_from(self.mountpoint, self.device)

    def unmount(self) -> None:
        if os.path.ismount(self.mountpoint):
            subprocess.run(["umount", str(self.mountpoint)], check=True)

    def close(self) -> None:
        self.unmount()
        subprocess.run(["losetup", "--detach", self.device], check=False)


@pytest.fixture
def loop_disk(tmp_path):
    _need_root_tools()
    disk = LoopDisk(tmp_path)
    yield disk
    disk.close()


@pytest.fixture
def converger_for(tmp_path, dockerd, instance_image, loop_disk):
    config = DockerConfig(socket=dockerd.socket, gpu_mode="devices",
                          gpu_devices=stand_in_devices(STUB_GPUS),
                          port_range=(22400, 22499), stop_timeout=2)
    key = NodeKey.generate(tmp_path / "key.pem")
    runtimes = []

    def converger():
        runtime = RecordingRuntime(DockerRuntime(config, tmp_path / "runtime"))
        runtimes.append(runtime)
        return Converger(node="n1", runtime=runtime, disks=loop_disk,
                         journal=Journal(tmp_path / "journal.json"),
                         outbox=Outbox(tmp_path / "outbox.json"), key=key,
                         images={IMAGE_SLUG: instance_image}, public_host="192.0.2.10")
    yield converger
    for lease_id in runtimes[0].runtime.lease_ids():
        runtimes[0].runtime.ensure_absent(lease_id)


def _on_disk(disk: LoopDisk, name: str) -> bytes | None:
    """The file as stored on the lease's block device (mounted again to look)."""
    disk.unmount()
    leftover = (disk.mountpoint / name).exists()       # on the root fs underneath?
    assert not leftover, f"{name} was written to the bare mount point, not the disk"
    subprocess.run(["mount", disk.device, str(disk.mountpoint)], check=True)
    path = disk.mountpoint / name
    return path.read_bytes() if path.exists() else None


def test_the_shipped_unit_gives_the_agent_no_mount_namespace():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(UNIT)
    service = dict(unit["Service"])
    assert not MOUNT_NAMESPACE_OPTIONS & set(service), \
        f"{sorted(MOUNT_NAMESPACE_OPTIONS & set(service))} hide the agent's mounts from dockerd"
    assert service["NoNewPrivileges"] == "yes" and service["UMask"] == "0077"
    assert service["RestrictSUIDSGID"] == "yes" and service["LockPersonality"] == "yes"
    # not enrolled / bad config: restarting cannot help (an image with the unit enabled
    # before enrolment would restart the agent every 5 s until it is enrolled)
    from nodeagent.cli import EXIT_CONFIG, EXIT_NOT_ENROLLED
    assert set(service["RestartPreventExitStatus"].split()) == {str(EXIT_NOT_ENROLLED), str(EXIT_CONFIG)}
    doc = unit["Unit"]["Documentation"]
    assert doc == "file:///usr/share/doc/gpu-node-agent/README.md"
    assert doc.removeprefix("file://") in (ROOT / "nodeagent" / "README.md").read_text()


def test_a_mount_in_a_private_namespace_is_not_where_dockerd_looks(loop_disk, dockerd):
    """The defect, reproduced: the agent's mount under `unshare --mount --propagation
    slave` is visible to itself only. The check the agent relies on tells them apart."""
    probe = (f"import subprocess, sys; from nodeagent.disks.mounts import mounted_from as m, "
             f"shares_host_namespace as s, OWN_MOUNTINFO as own; "
             f"subprocess.run(['mount', {loop_disk.device!r}, {str(loop_disk.mountpoint)!r}], "
             f"check=True); print(m({str(loop_disk.mountpoint)!r}, {loop_disk.device!r}, own), "
             f"m({str(loop_disk.mountpoint)!r}, {loop_disk.device!r}), s())")
    inside = subprocess.run(["unshare", "--mount", "--propagation", "slave", sys.executable,
                             "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.split() == ["True", "False", "False"]   # own view / host view / ns
    assert not os.path.ismount(loop_disk.mountpoint)             # gone with the namespace
    assert shares_host_namespace()

    loop_disk.ensure_ready(1, 1)                                  # in the host namespace
    dockerd_view = Path(f"/proc/{dockerd.pid}/mountinfo")
    assert mounted_from(loop_disk.mountpoint, loop_disk.device, dockerd_view)
    assert loop_disk.is_ready(1)


def test_the_agent_refuses_the_luks_backend_in_a_private_mount_namespace(
        tmp_path, dockerd, nvml_stub):
    _need_root_tools()
    storefront = StorefrontDouble()
    storefront.start()
    try:
        config = write_config(tmp_path / "config.toml", state_dir=tmp_path / "state",
                              dockerd=dockerd, image_ref="unused", public_host="192.0.2.1")
        config.write_text(config.read_text()
                          .replace('disk_backend = "directory"', 'disk_backend = "luks"')
                          .replace(f'root = "{tmp_path}/state/disks"',
                                   'carver = "lvm"\nvolume_group = "gpu-leases-test"'))
        env = agent_env(nvml_stub)
        assert agent_cli(config, "enrol", "--url", storefront.url, "--code",
                         storefront.enrolment_code("n1"), env=env).returncode == 0
        agent = Path(sys.executable).parent / "gpu-node-agent"
        refused = subprocess.run(["unshare", "--mount", "--propagation", "slave", str(agent),
                                  "--config", str(config), "run"], env=env,
                                 capture_output=True, text=True, timeout=60)
    finally:
        storefront.stop()
    assert refused.returncode == 3, refused.stderr
    assert "own mount namespace" in refused.stderr and "invisible to dockerd" in refused.stderr
    assert storefront.nodes["n1"].reports == []                  # it never ran a round


def test_after_a_reboot_the_disk_is_mounted_before_the_container_starts(
        converger_for, loop_disk, dockerd):
    first = converger_for()
    [report] = first.converge([desired(51, "51:running:1")], GPUS)
    assert report["state"] == "running"
    client = dockerd.client()
    container = client.containers.get("lease-51")
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"

    # A reboot: dockerd comes up without starting it (no restart policy), disks unmounted.
    container.stop(timeout=2)
    loop_disk.unmount()
    rebooted = converger_for()
    [report] = rebooted.converge([desired(51, "51:running:1")], GPUS)
    assert report["state"] == "running" and report["error"] is None
    assert rebooted.runtime.calls == ["ensure_running"] and loop_disk.is_ready(51)
    exit_code, _ = client.containers.get("lease-51").exec_run(
        ["/bin/sh", "-c", "echo after-reboot > /workspace/f"])
    assert exit_code == 0
    assert _on_disk(loop_disk, "f") == b"after-reboot\n"
    kinds = [e["kind"] for e in rebooted.outbox.pending()]
    assert kinds == ["instance_ready"]                  # one record for the op, not two


def test_dockerd_cannot_start_an_instance_on_the_bare_mount_point(converger_for, loop_disk, dockerd):
    """A restart policy left by an older agent: dockerd starts the container at boot, before
    the disk is mounted. Its writable layer lives on that disk (nodeagent/runtime/
    instance_root.py), so the start fails and nothing lands under the bare mount point; the
    agent then mounts the disk, drops the policy and starts it."""
    converger = converger_for()
    converger.converge([desired(52, "52:running:1")], GPUS)
    container = dockerd.client().containers.get("lease-52")
    assert container.exec_run(["/bin/sh", "-c", "echo kept > /root/kept"]).exit_code == 0
    container.stop(timeout=2)
    loop_disk.unmount()
    container.update(restart_policy={"Name": "unless-stopped"})
    with pytest.raises(docker.errors.APIError, match="overlay"):
        container.start()                                 # dockerd at boot
    assert os.listdir(loop_disk.mountpoint) == []

    restarted = converger_for()
    [report] = restarted.converge([desired(52, "52:running:1")], GPUS)
    assert report["state"] == "running"
    assert restarted.runtime.calls == ["ensure_running"]
    container.reload()
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"
    assert container.exec_run(["/bin/sh", "-c", "echo x > /workspace/g"]).exit_code == 0
    assert _on_disk(loop_disk, "g") == b"x\n"
    assert container.exec_run(["cat", "/root/kept"]).output == b"kept\n"


def test_no_container_starts_while_its_disk_is_not_mounted(converger_for, loop_disk, dockerd):
    loop_disk.mount_on_ready = False                      # e.g. mounted only for the agent
    converger = converger_for()
    [report] = converger.converge([desired(53, "53:running:1")], GPUS)
    assert report["state"] == "failed"
    assert report["error"]["code"] == "disk_not_mounted"
    assert converger.runtime.calls == [] and loop_disk.ready_calls == 1
    assert dockerd.client().containers.list(all=True, filters={"name": "lease-53"}) == []
    assert converger.outbox.pending() == []               # no instance_ready

    loop_disk.mount_on_ready = True                       # next round: mounted, started
    [report] = converger.converge([desired(53, "53:running:1")], GPUS)
    assert report["state"] == "running" and converger.runtime.calls == ["ensure_running"]

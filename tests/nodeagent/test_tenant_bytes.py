"""No tenant byte outside its lease's disk, proven by a raw scan: a tenant writes a random
marker into /root (the Hugging Face cache), /tmp, /var/tmp, /opt, /home, site-packages,
/etc/hosts, /workspace and PID 1's stdout; after the lease is released (its container
removed, its disk destroyed) the raw bytes of the node's storage — dockerd's whole
data-root file system image, free blocks included, and every file the node's tests keep
— hold the marker 0 times. The same marker is first found on the lease's own disk while
it lives, so the scan is shown able to find what it looks for.

Here the lease disks are loop-mounted ext4 (no device-mapper on this kernel, so no LUKS:
the node in a box runs the same scan on the production path, `luks` backend included),
dockerd is the production storage driver (overlay2) and each writable layer is limited by
its lease's disk, which a second test fills."""
import logging
import os
import re
import secrets
import subprocess
import tempfile
from pathlib import Path

import pytest

from nodeagent.config import ConfigError, DockerConfig, parse_config
from nodeagent.interfaces import InstanceSpec, OperationFailed
from nodeagent.runtime.docker import DockerRuntime
from nodeagent.runtime.instance_root import INSTANCE_ROOT

from .conftest import stand_in_devices
from .loop_disks import LoopDisks
from .raw_scan import count, scan

GPUS = ("GPU-7e4a47b1-0000-4000-8000-00000000000a", "GPU-7e4a47b1-0000-4000-8000-00000000000b")
A, B = 61, 62
DISK_MB = 300
COPIES = 2000
# Where a fine-tuning tenant's bytes land outside /workspace by default.
PLACES = ("/root/.cache/huggingface/hub/marker.txt", "/tmp/marker.txt", "/var/tmp/marker.txt",
          "/opt/marker.txt", "/home/marker.txt", "/usr/local/lib/python3/site-packages/marker.py",
          "/workspace/marker.txt")


@pytest.fixture
def node(dockerd, instance_image, node_tmp_root):
    work = Path(tempfile.mkdtemp(prefix="tenant-bytes-", dir=node_tmp_root))
    work.chmod(0o711)
    config = DockerConfig(socket=dockerd.socket, gpu_mode="devices",
                          gpu_devices=stand_in_devices(GPUS), port_range=(22600, 22649),
                          stop_timeout=2)
    runtime = DockerRuntime(config, work / "runtime")
    disks = LoopDisks(work / "disks", DISK_MB)

    def start(lease_id, gpu):
        return runtime.ensure_running(InstanceSpec(
            lease_id=lease_id, image=instance_image, gpu_uuids=(gpu,),
            ssh_authorized_keys=("ssh-ed25519 AAAAC3Nza tenant",), cpus=1, memory_gb=1,
            shm_gb=1, disk_path=disks.ensure_ready(lease_id, 1)))

    def sh(lease_id, command) -> tuple[int, str]:
        result = runtime.client.containers.get(f"lease-{lease_id}").exec_run(
            ["/bin/bash", "-c", command])
        return result.exit_code, result.output.decode(errors="replace")

    node = type("Node", (), {"runtime": runtime, "disks": disks, "start": staticmethod(start),
                             "sh": staticmethod(sh), "work": work})
    try:
        yield node
    finally:
        for lease_id in runtime.lease_ids():
            runtime.ensure_absent(lease_id)
        for lease_id in (A, B):
            disks.destroy(lease_id)


def test_no_marker_outside_the_lease_disk_after_release(node, dockerd, node_tmp_root):
    marker = f"tenant-marker-{secrets.token_hex(16)}"
    node.start(A, GPUS[0])
    lines = "".join(f"{marker}\\n" for _ in range(20))
    writes = " && ".join(
        f"mkdir -p {os.path.dirname(p)} && for i in $(seq {COPIES // 20}); do printf '{lines}'; done > {p}"
        for p in PLACES)
    assert node.sh(A, writes)[0] == 0
    assert node.sh(A, f"echo {marker} >> /etc/hosts && echo {marker} > /proc/1/fd/1 && "
                      f"echo {marker} > /proc/1/fd/2 && sync") == (0, "")
    assert node.sh(A, f"grep -c {marker} {PLACES[0]}")[1].strip() == str(COPIES)

    # the scan finds the marker where it is: on the lease's own (here unencrypted) disk
    subprocess.run(["sync"], check=True)
    on_disk = count(node.disks.image(A), marker.encode())
    assert on_disk >= COPIES * len(PLACES), on_disk
    # ... and the instance cannot see or change the agent's directory on that disk
    assert node.sh(A, f"ls -A /workspace/{INSTANCE_ROOT}") == (0, "")
    assert node.sh(A, f"touch /workspace/{INSTANCE_ROOT}/x")[0] != 0

    node.runtime.ensure_absent(A)
    node.disks.destroy(A)
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    searched = [dockerd.data_image, node_tmp_root]
    found = scan(searched, marker.encode())
    size = dockerd.data_image.stat().st_size
    print(f"tenant bytes: {COPIES * len(PLACES)} marker copies written; after release "
          f"{sum(found.values())} found in dockerd's data root ({size // 1024 ** 2} MiB image, "
          f"free blocks included) and the node's files: {found}")
    assert found == {}


def test_a_full_writable_layer_fills_only_its_own_disk(node):
    node.start(A, GPUS[0])
    node.start(B, GPUS[1])
    fill = node.sh(A, f"dd if=/dev/zero of=/root/fill bs=1M count={DISK_MB * 2} 2>&1; sync")
    assert re.search(r"No space left on device", fill[1]), fill[1]
    written = int(node.sh(A, "stat -c %s /root/fill")[1])
    assert written < DISK_MB * 1024 ** 2
    assert node.sh(A, "echo x > /workspace/more 2>&1")[0] != 0       # one disk, one limit
    data_root = node.runtime.client.info()["DockerRootDir"]
    assert os.statvfs(data_root).f_bavail * os.statvfs(data_root).f_frsize > 1024 ** 3
    assert node.sh(B, "dd if=/dev/zero of=/root/b bs=1M count=50 2>&1 && rm /root/b && echo b-ok")[1] \
        .endswith("b-ok\n")
    node.sh(A, "rm -f /root/fill")
    assert node.sh(A, "echo again > /root/after && cat /root/after") == (0, "again\n")


def test_the_instance_does_not_start_when_its_disk_is_not_mounted(node, instance_image):
    node.start(A, GPUS[0])
    assert node.sh(A, "echo kept > /root/kept && sync")[0] == 0
    node.runtime.ensure_stopped(A)
    node.disks.detach(A)        # a reboot: the lease's disk not (yet) opened and mounted
    with pytest.raises(OperationFailed, match="not mounted"):
        node.runtime.ensure_running(InstanceSpec(
            lease_id=A, image=instance_image, gpu_uuids=(GPUS[0],),
            ssh_authorized_keys=("ssh-ed25519 AAAAC3Nza tenant",), cpus=1, memory_gb=1,
            shm_gb=1, disk_path=node.disks.mount_path(A)))
    assert node.runtime.status(A).state == "stopped"
    assert not any(Path(node.disks.mount_path(A)).iterdir()), "written under the bare mount point"
    node.start(A, GPUS[0])               # mounted again: the same root file system
    assert node.sh(A, "cat /root/kept") == (0, "kept\n")


def test_an_older_configs_writable_layer_and_log_limits_are_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="nodeagent.config"):
        config = parse_config({"docker": {"rootfs_size": "50G", "log_max_size": "10m"}})
    assert not hasattr(config.docker, "rootfs_size") and not hasattr(config.docker, "log_max_size")
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "rootfs_size is no longer used" in warned and "log_max_size is no longer used" in warned
    with pytest.raises(ConfigError, match="unknown"):
        parse_config({"docker": {"rootfs_sise": "50G"}})
